//! What the client commands (`sparring run`, `sparring result`) share: where
//! the server is, the key that acts for the user, and API errors as a
//! person reads them.

use clap::Args;
use sparring_client::types;

/// A Sparring server and an API key for it.
#[derive(Args, Clone, Debug)]
pub struct Remote {
    /// The server (its `/v1` may be left out).
    #[arg(long, env = "SPARRING_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An API key of yours. Prefer the environment variable: a command's
    /// arguments can be read by other users of the machine.
    #[arg(long, env = "SPARRING_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl Remote {
    pub fn client(&self) -> anyhow::Result<sparring_client::Client> {
        // A key stored from a file often ends with a line break.
        let Some(key) = self.api_key.as_deref().map(str::trim).filter(|k| !k.is_empty()) else {
            anyhow::bail!(
                "no API key: set SPARRING_API_KEY (or give --api-key, which other users of the machine can see)"
            )
        };
        // Trimmed as the key is: a URL stored in a file ends with a line
        // break as often.
        let url = self.url.trim();
        check_url(url)?;
        sparring_client::Client::with_api_key(&base_url(url), key).map_err(|_| {
            anyhow::anyhow!(
                "the API key contains a line break or another character a header cannot carry: \
                 check how --api-key or SPARRING_API_KEY is set"
            )
        })
    }
}

/// Refuses a `--url` that no request could be sent to (a scheme left out is
/// a common slip in a CI variable), rather than trying it for a minute.
fn check_url(url: &str) -> anyhow::Result<()> {
    if !is_http_url(url) {
        // Not echoed: it may hold a password.
        anyhow::bail!("--url/SPARRING_URL must look like https://host[:port] (with http:// or https://)");
    }
    Ok(())
}

/// Whether `url` is an `http://` or `https://` URL with a host.
pub fn is_http_url(url: &str) -> bool {
    url.parse::<http::Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some_and(|h| !h.is_empty()))
}

fn base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if url.ends_with("/v1") {
        url.to_string()
    } else {
        format!("{url}/v1")
    }
}

/// `text` (which may quote an agent under test) with its control
/// characters other than line breaks and tabs shown as `\u{…}` escapes, so
/// that printing it cannot move the cursor, recolour or retitle the reader's
/// terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// An API error as a person reads it: the status, the stable code and the
/// server's message.
pub fn api_error(e: sparring_client::Error<types::Error>) -> anyhow::Error {
    match e {
        sparring_client::Error::ErrorResponse(r) => {
            let status = r.status();
            let body = r.into_inner();
            anyhow::anyhow!("{} {}: {} (request {})", status.as_u16(), body.error_code, body.message, body.request_id)
        }
        sparring_client::Error::CommunicationError(e) => anyhow::Error::new(e).context("could not reach the server"),
        // Not JSON, or JSON of another shape: something else answers at that
        // address, or in front of the server (a proxy's error page). Its
        // status is not kept by the client; the page's first words often
        // say it, and what answered.
        sparring_client::Error::InvalidResponsePayload(body, e) => {
            anyhow::anyhow!(
                "the answer is not a Sparring server's ({e}; it began `{}`): is --url a Sparring server, and is it up?",
                beginning(&body)
            )
        }
        // A status the API does not answer with: a redirect (not followed,
        // so that the key goes nowhere but `--url`), or a proxy's or
        // gateway's own answer.
        sparring_client::Error::UnexpectedResponse(r) => {
            let status = r.status();
            match r.headers().get(http::header::LOCATION).filter(|_| status.is_redirection()) {
                Some(to) => anyhow::anyhow!(
                    "the server answered {status}, a redirect to `{}`, which is not followed (the API key is sent \
                     to --url only): give --url the address the API is served at",
                    beginning(to.as_bytes())
                ),
                None => anyhow::anyhow!(
                    "the server answered {status}, which the API never does: is something in front of it?"
                ),
            }
        }
        other => anyhow::anyhow!("{other}"),
    }
}

/// The first words of an answer's body, on one line and printable.
fn beginning(body: &[u8]) -> String {
    const SHOWN: usize = 120;
    let text = String::from_utf8_lossy(&body[..body.len().min(SHOWN)]);
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut shown = printable(&words.join(" "));
    if body.len() > SHOWN {
        shown.push('…');
    }
    shown
}

/// Writes to stdout. A reader that stopped early (`sparring … | head`) has
/// what it wanted: a closed pipe is no failure (Rust ignores SIGPIPE, so
/// `print!` would panic there, exit 101).
pub fn write_stdout(text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_fmt(text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_answer_that_is_not_ours_is_shown_by_its_first_words() {
        let page = b"<html>\n  <h1>503 Service Unavailable</h1>\n</html>";
        assert_eq!(super::beginning(page), "<html> <h1>503 Service Unavailable</h1> </html>");
        let long = "x".repeat(500);
        assert_eq!(super::beginning(long.as_bytes()), format!("{}…", "x".repeat(120)));
        assert_eq!(super::beginning(b"\x1b[2Jhi"), "\\u{1b}[2Jhi");
    }

    /// A URL read from a file (`SPARRING_URL=$(cat url.txt)` keeps none,
    /// but a CI variable pasted with its line break does) is taken as the
    /// key is, trimmed; it was refused as not looking like a URL.
    #[test]
    fn a_url_with_a_line_break_around_it_is_taken_trimmed() {
        let remote = super::Remote {
            url: "  https://sparring.example.com/v1\n".to_string(),
            api_key: Some("spk_x\n".to_string()),
        };
        use sparring_client::ClientInfo as _;
        let client = remote.client().expect("a trimmed URL is a URL");
        assert_eq!(client.baseurl(), "https://sparring.example.com/v1");
        let inside = super::Remote { url: "https://sparring.example.com\n/v1".to_string(), api_key: Some("k".into()) };
        assert!(inside.client().is_err(), "a line break inside is no URL");
    }

    #[test]
    fn what_an_agent_says_cannot_drive_the_terminal() {
        let said = "Sure\u{1b}]0;owned\u{7}\u{1b}[2J\r\nDone\u{9b}31m\tok";
        let shown = super::printable(said);
        assert_eq!(shown, "Sure\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\nDone\\u{9b}31m\tok");
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{shown:?}");
    }
}
