//! Where the engine may connect: agents under test (`http` and `websocket`
//! channels), LLM endpoints (simulated callers, judges) and webhook
//! receivers, all at URLs a tenant chooses.
//!
//! A server serving several tenants must not become their way into its own
//! network: a channel aimed at `http://169.254.169.254/…` (a cloud's
//! metadata service) or at an internal admin page would have its answer
//! quoted back in the result's failure reason. So by default the engine
//! connects only to public addresses: a URL naming a private, loopback,
//! link-local or otherwise special address is refused before any
//! connection, and a host name is resolved by [`PublicOnly`], which keeps
//! only public addresses (so a name that resolves, or is later made to
//! resolve, to a private address is refused too). Redirects are followed only
//! to the same origin, and only those that keep the POST and its body (307,
//! 308; below), so they cannot leave the checked address; by webhooks not at
//! all ([`Outbound::for_webhooks`]).
//! `sparring serve --allow-private-targets` lifts this for a server whose
//! agents live on its own network (local development, a private deployment).

use std::cell::Cell;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;

/// Said whenever an address is refused.
const REFUSED: &str =
    "this server calls only public addresses (its operator can allow private ones with `--allow-private-targets`)";

/// The engine's HTTP client, with the rule on which addresses it may reach.
#[derive(Clone)]
pub struct Outbound {
    client: reqwest::Client,
    allow_private: bool,
}

impl Outbound {
    /// `allow_private`: whether private and local addresses may be called;
    /// `idle_per_host`: connections kept open to one host.
    pub fn new(allow_private: bool, idle_per_host: usize) -> Outbound {
        Outbound::with_redirects(allow_private, idle_per_host, redirects())
    }

    /// The client of webhook deliveries: as [`Outbound::new`], but a
    /// redirect is never followed, within the origin either. A `301`, `302`
    /// or `303` would turn the signed `POST` into a `GET` without its body,
    /// whose `2xx` would read as the event delivered; a `307` or `308`
    /// would send it to another URL than the project's. The receiver's 3xx
    /// answer is the attempt's, a failed one.
    ///
    /// Nor is a connection kept for another request: each attempt makes its
    /// own, so the check of [`Outbound::checking_when_connected`] runs
    /// before every request (it counts the attempt, durably, before a byte
    /// of it is sent). Attempts are few, one per event and retry.
    pub fn for_webhooks(allow_private: bool) -> Outbound {
        Outbound::with_redirects(allow_private, 0, reqwest::redirect::Policy::none())
    }

    fn with_redirects(allow_private: bool, idle_per_host: usize, redirects: reqwest::redirect::Policy) -> Outbound {
        let mut builder = reqwest::Client::builder()
            .pool_max_idle_per_host(idle_per_host)
            .connector_layer(tower_layer::layer_fn(ConnectBy))
            .redirect(redirects);
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(PublicOnly));
        }
        let client = builder.build().expect("the HTTP client builds with default TLS settings");
        Outbound { client, allow_private }
    }

    /// Any address: for tests of the engine's parts against loopback.
    #[cfg(test)]
    pub fn anywhere() -> Outbound {
        Outbound::new(true, 8)
    }

    /// A `POST` to `url`, unless `url` names an address this server may not
    /// call (then why, for the result or the delivery).
    pub fn post(&self, url: &str) -> Result<reqwest::RequestBuilder, String> {
        if !self.allow_private {
            check_address_in(url)?;
        }
        Ok(self.client.post(url))
    }

    /// The client `builder` makes, with the time limit of
    /// [`Outbound::connecting_by`] and the redirects followed as
    /// [`Outbound::new`]'s, any address allowed: for tests of the
    /// engine's parts that need a client of their own.
    #[cfg(test)]
    pub fn of(builder: reqwest::ClientBuilder) -> Outbound {
        let client = builder.connector_layer(tower_layer::layer_fn(ConnectBy)).redirect(redirects()).build().unwrap();
        Outbound { client, allow_private: true }
    }

    /// Runs `requests` (made with this client) so that a connection one of
    /// them opens must be made (resolved, connected and, for `https`, its
    /// TLS set up) by `by`: one that is not fails as a connect error
    /// ([`reqwest::Error::is_connect`]) that [`connect_too_late`] tells
    /// apart. So an agent that never took the connection is not mistaken
    /// for one that took the request and is slow to answer: a time limit
    /// around the whole request cannot say which of the two ran out. A
    /// request sent over a pooled connection opens none.
    ///
    /// Also gives when the last connection they opened and were sent over
    /// was made (`None` when they opened none): a request is sent only once
    /// its connection is, and what came before (resolving, connecting, TLS)
    /// is no part of how long its answer took.
    pub async fn connecting_by<F: Future>(&self, by: Instant, requests: F) -> (F::Output, Option<Instant>) {
        let limit = ConnectLimit { by, made: Cell::new(None) };
        let mut scoped = std::pin::pin!(CONNECT_BY.scope(limit, requests));
        let output = scoped.as_mut().await;
        let made = scoped.as_mut().take_value().and_then(|limit| limit.made.get());
        (output, made)
    }

    /// Runs `requests` (made with this client) so that a connection one of
    /// them opens carries a request only if `still` says so once it is made
    /// (resolved, connected and, for `https`, its TLS set up): when it says
    /// why not, the connection is closed unused and the request fails with
    /// an error that [`not_sent`] tells apart. For a request that must not
    /// go where it was meant to go if that changed while its connection was
    /// being made, which can take seconds; a request sent over a pooled
    /// connection opens none, and goes at once (the webhooks' client pools
    /// none: [`Outbound::for_webhooks`]).
    pub async fn checking_when_connected<F: Future>(&self, still: Check, requests: F) -> F::Output {
        ON_CONNECTED.scope(still, requests).await
    }

    /// The addresses a connection to `host:port` may go to (a websocket
    /// channel's target), in the resolver's order.
    pub async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let found: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("`{host}` could not be resolved: {e}"))?
                .collect(),
        };
        if self.allow_private {
            return Ok(found);
        }
        public_only(host, found)
    }
}

/// The redirects the engine follows. A channel's header values (and an
/// LLM's key) go only where they were set, and only to an address checked
/// here: a redirect to another origin is not followed (the agent's 3xx
/// answer is the turn's error). Every request here is a POST whose body is
/// the point of it (a caller's line, a prompt, an event): a 301, 302 or 303
/// would be followed as a GET without that body, and its answer taken for
/// the answer to the POST, so only a 307 or 308, which keep both, is
/// followed.
fn redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let from = attempt.previous()[0].origin();
        let keeps_request = matches!(attempt.status().as_u16(), 307 | 308);
        if attempt.previous().len() > 5 {
            attempt.error("more than 5 redirects")
        } else if keeps_request && attempt.url().origin() == from {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// What [`Outbound::checking_when_connected`] asks of a connection once it
/// is made: nothing (`Ok`), or why it must carry no request. It may wait
/// (for a write, say) before it answers.
pub type Check = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// The time limit of [`Outbound::connecting_by`] for the connections of the
/// requests it runs, and when the last of them was made.
struct ConnectLimit {
    by: Instant,
    made: Cell<Option<Instant>>,
}

tokio::task_local! {
    /// See [`ConnectLimit`].
    static CONNECT_BY: ConnectLimit;
    /// The check of [`Outbound::checking_when_connected`] for the
    /// connections of the requests it runs.
    static ON_CONNECTED: Check;
}

/// Why `e`'s request was not sent, when its connection was made and then
/// closed unused because the check of [`Outbound::checking_when_connected`]
/// said so.
pub fn not_sent(e: &reqwest::Error) -> Option<String> {
    cause::<NotSent>(e).map(|NotSent(why)| why.clone())
}

/// The error of type `T` among `e`'s causes, if any.
fn cause<T: std::error::Error + 'static>(e: &reqwest::Error) -> Option<&T> {
    let mut source = std::error::Error::source(e);
    while let Some(next) = source {
        if let Some(found) = next.downcast_ref::<T>() {
            return Some(found);
        }
        source = next.source();
    }
    None
}

/// The error of a connection closed unused (see [`not_sent`]).
#[derive(Debug)]
struct NotSent(String);

impl std::fmt::Display for NotSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not sent: {}", self.0)
    }
}

impl std::error::Error for NotSent {}

/// Whether `e` is a request's failure because its connection was not made
/// by the time [`Outbound::connecting_by`] gave it.
pub fn connect_too_late(e: &reqwest::Error) -> bool {
    cause::<ConnectTooLate>(e).is_some()
}

/// The error of a connection not made in time (see [`connect_too_late`]).
#[derive(Debug)]
struct ConnectTooLate;

impl std::fmt::Display for ConnectTooLate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no connection was made in time")
    }
}

impl std::error::Error for ConnectTooLate {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The layer on reqwest's connector that holds a connection to the time
/// limit of the [`Outbound::connecting_by`] it is opened in, and hands it
/// over only if the check of the [`Outbound::checking_when_connected`] it
/// is opened in passes once it is made; both read when the connection
/// starts: the pool starts it within the request's own task. Outside one
/// (an LLM's request, the `end` of a call), a connection has no limit, or
/// no check, of its own here.
#[derive(Clone)]
struct ConnectBy<S>(S);

impl<S, R> tower_service::Service<R> for ConnectBy<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Response: Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, destination: R) -> Self::Future {
        let by = CONNECT_BY.try_with(|limit| limit.by).ok();
        let still = ON_CONNECTED.try_with(Arc::clone).ok();
        let connecting = self.0.call(destination);
        Box::pin(async move {
            let connection = match by {
                None => connecting.await,
                Some(by) => tokio::time::timeout_at(by, connecting)
                    .await
                    .unwrap_or_else(|_| Err(Box::new(ConnectTooLate) as BoxError)),
            }?;
            if let Some(still) = still {
                // Dropped, the connection is closed before a byte of the
                // request was written to it.
                still().await.map_err(|why| Box::new(NotSent(why)) as BoxError)?;
            }
            // When it was made, for the requests of `connecting_by` that it
            // carries: only where their own task completes it. One the pool
            // completes in the background (an idle connection came first,
            // and the request went over that) carries none of theirs, and
            // is out of their scope there.
            let _ = CONNECT_BY.try_with(|limit| limit.made.set(Some(Instant::now())));
            Ok(connection)
        })
    }
}

/// 400 naming `field` when `url` names, by address, one that a server
/// calling only public addresses (`allow_private` false) will not call: said
/// when the URL is given, rather than at the first run. A host name is not
/// resolved here (it may resolve elsewhere when it is called); the check at
/// the call holds for it.
pub fn check_given(allow_private: bool, field: &str, url: &str) -> crate::failure::Result<()> {
    if allow_private {
        return Ok(());
    }
    check_address_in(url).map_err(|refused| crate::failure::Failure::invalid(field, refused))
}

/// Why `url` may not be called, when its host is an address (in any of the
/// spellings the URL parser reads as one) that is not public. A host name,
/// or a URL that does not parse, passes: the resolver, or the request,
/// decides for those.
fn check_address_in(url: &str) -> Result<(), String> {
    let ip = match reqwest::Url::parse(url).ok().as_ref().and_then(|u| u.host().map(|h| h.to_owned())) {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        _ => return Ok(()),
    };
    check(ip)
}

fn check(ip: IpAddr) -> Result<(), String> {
    if is_public(ip) {
        Ok(())
    } else {
        Err(format!("{ip} is a private or local address; {REFUSED}"))
    }
}

/// The public ones of `found`, the addresses of `host`; an error naming them
/// when there are none.
fn public_only(host: &str, found: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, String> {
    if found.is_empty() {
        return Err(format!("`{host}` has no address"));
    }
    let public: Vec<SocketAddr> = found.iter().copied().filter(|a| is_public(a.ip())).collect();
    if public.is_empty() {
        let ips: Vec<String> = found.iter().map(|a| a.ip().to_string()).collect();
        return Err(format!("`{host}` resolves only to private or local addresses ({}); {REFUSED}", ips.join(", ")));
    }
    Ok(public)
}

/// Resolves host names to their public addresses only (see the module).
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public = public_only(&host, found)?;
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `ip` is an address of the public internet: not loopback,
/// private, link-local, shared (carrier-grade NAT), unspecified, multicast,
/// broadcast, documentation, benchmarking or reserved, nor an IPv6 address
/// embedding such an IPv4 one.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => is_public_v6(ip),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network"
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 169 && b == 254) // link-local: cloud metadata services
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 168)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
    }
    // 6to4 (2002::/16) reaches the IPv4 address in bits 16 to 47.
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || s[..6] == [0; 6] // IPv4-compatible (deprecated)
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[..4] == [0x100, 0, 0, 0] // discard-only
        || s[..3] == [0x64, 0xff9b, 1] // local-use NAT64 (RFC 8215): a network's own, to its private IPv4 too
        || s[..6] == [0, 0, 0, 0, 0xffff, 0]) // IPv4-translated (SIIT, RFC 2765)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_of_the_public_internet_are_public() {
        for private in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "192.0.2.7",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "64:ff9b:1::a9fe:a9fe",
            "64:ff9b:1:a9fe:a9:fe00::",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
            "2002:a00:1::1",
            "::ffff:0:a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private} is not public");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "172.32.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public} is public");
        }
    }

    #[tokio::test]
    async fn a_private_address_is_refused_before_any_connection() {
        let outbound = Outbound::new(false, 1);
        for url in ["http://127.0.0.1:9/turn", "http://[::1]:9/turn", "https://169.254.169.254/latest/meta-data/"] {
            let refused = outbound.post(url).map(|_| ()).unwrap_err();
            assert!(refused.contains("private or local") && refused.contains("--allow-private-targets"), "{refused}");
        }
        // A name: refused when it resolves to private addresses only.
        let refused = outbound.addresses("localhost", 9).await.unwrap_err();
        assert!(refused.contains("`localhost` resolves only to private or local addresses"), "{refused}");
        let sent = outbound.post("http://localhost:9/turn").unwrap().send().await.unwrap_err();
        let mut source: &dyn std::error::Error = &sent;
        while let Some(next) = source.source() {
            source = next;
        }
        assert!(source.to_string().contains("resolves only to private or local addresses"), "{source}");
        // Allowed, everything goes.
        assert!(Outbound::anywhere().post("http://127.0.0.1:9/turn").is_ok());
        assert_eq!(Outbound::anywhere().addresses("127.0.0.1", 9).await.unwrap(), ["127.0.0.1:9".parse().unwrap()]);
    }
}
