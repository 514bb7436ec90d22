//! The baseline: what dropshot itself serves on this machine with no work
//! behind it.
//!
//! One endpoint returning a constant small JSON object: no authentication,
//! no database. Everything else is as in `sparring serve`: the same dropshot
//! (one `Cargo.lock`), the same `ConfigDropshot` (taken from
//! [`sparring_impl::dropshot_config`]: body limit, handler task mode), the
//! same tokio runtime (multi-threaded, one worker per core) and the same
//! logger ([`sparring_impl::logging::json_to_stderr`], as `sparring serve
//! --log-format json`), so dropshot's per-request log line costs both the same.

use std::net::SocketAddr;

use dropshot::{endpoint, ApiDescription, HttpError, HttpResponseOk, RequestContext, ServerBuilder};
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema)]
struct Pong {
    ok: bool,
    service: &'static str,
}

/// `GET /v1/ping`. The path is under `/v1` like the API's, so that the
/// router walks as many segments as for `/v1/api-keys`.
#[endpoint { method = GET, path = "/v1/ping" }]
async fn ping(_rqctx: RequestContext<()>) -> Result<HttpResponseOk<Pong>, HttpError> {
    Ok(HttpResponseOk(Pong { ok: true, service: "baseline" }))
}

/// Serves until killed.
pub fn serve(bind: SocketAddr) -> anyhow::Result<()> {
    // `sparring` runs on `tokio::runtime::Runtime::new()`: the same here.
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let mut api = ApiDescription::new();
        api.register(ping).map_err(|e| anyhow::anyhow!("registering /v1/ping: {e}"))?;
        let server = ServerBuilder::new(api, (), sparring_impl::logging::json_to_stderr())
            .config(sparring_impl::dropshot_config(bind))
            .start()
            .map_err(|e| anyhow::anyhow!("starting the baseline on {bind}: {e}"))?;
        println!("listening on {}", server.local_addr());
        server.await.map_err(|e| anyhow::anyhow!(e))
    })
}
