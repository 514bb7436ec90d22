//! Admin commands that change what a running server keeps in memory go
//! through that server, so that it stays the only writer of it.
//!
//! The server listens on a Unix socket in its data dir ([`SOCKET_FILE`],
//! mode 0600): whoever may open it may open the database beside it, so the
//! socket asks for no credential. A command finds the server by the data
//! dir's lock: held, it sends its request on the socket, one JSON line
//! each way; free, it takes the lock itself and writes the database
//! directly, and no server can start meanwhile.
//!
//! `sparring admin create-key` goes this way: the server keeps users' first
//! pages of keys in memory, emptied by its own writes to `api_keys` (see
//! `api_keys::KeyPages`), which a key written by another process would not
//! empty. Nothing kept depends on what `admin grant-credits` writes, so it
//! still writes directly.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::TaskTracker;

use crate::api_keys::ApiKeyLabel;
use crate::AppState;

/// The socket's name in the data dir.
pub const SOCKET_FILE: &str = "admin.sock";

/// A request longer than this is refused (a label and an email are short).
const MAX_REQUEST: u64 = 64 * 1024;

/// How long the server waits for a connected client's request: a client
/// that connects and never sends its line would otherwise hold its task
/// (and socket) for as long as the server runs.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// How long a command waits for the server's answer: a key is one write,
/// which a server under heavy load still commits in milliseconds.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// A field it does not know is refused, not dropped: a newer command's
/// option would otherwise be ignored without a word.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    CreateKey { email: String, label: String },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Response {
    /// The raw key, shown once: not logged, not kept.
    Key(String),
    Error(String),
}

/// Binds the socket in `data_dir`, replacing one left by a server that
/// died (the caller holds the data dir's lock, so no live server owns it).
pub fn bind(data_dir: &Path) -> anyhow::Result<(UnixListener, PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = data_dir.join(SOCKET_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the old {}", path.display()))
        }
        _ => {}
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok((listener, path))
}

/// Answers admin requests until the task is aborted, from processes of the
/// user the server runs as (or root) only: the socket's mode 0600 is set
/// just after it is bound, and a connection made in between would wait in
/// its backlog. Each connection is answered on a task of `answering`, which
/// the server's shutdown waits for (see [`drain`]).
pub async fn serve(listener: UnixListener, state: Arc<AppState>, answering: TaskTracker) {
    use std::os::unix::fs::MetadataExt as _;
    // The socket is this process's file: its owner is the user it runs as.
    let owner = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(std::path::Path::to_path_buf))
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.uid());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                slog::warn!(state.log, "admin socket: accepting failed"; "error" => %e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = stream.peer_cred().ok().map(|c| c.uid());
        if owner.is_none() || !(peer == owner || peer == Some(0)) {
            slog::warn!(state.log, "admin socket: a connection from another user was refused";
                        "uid" => peer.map_or_else(|| "unknown".to_string(), |u| u.to_string()));
            continue;
        }
        let state = state.clone();
        answering.spawn(async move {
            if let Err(e) = answer(stream, &state).await {
                slog::warn!(state.log, "admin request failed"; "error" => %e);
            }
        });
    }
}

/// Waits, at the server's shutdown (its socket no longer accepting), for
/// the connections it accepted to be answered: a key being made is
/// answered rather than made and never shown. Bounded, as a connection is
/// (its request within [`REQUEST_WAIT`], its write within the store's own
/// bounds), so that a stuck one cannot keep the server from stopping.
pub async fn drain(answering: TaskTracker, log: &slog::Logger) {
    answering.close();
    if !answering.is_empty() {
        slog::info!(log, "stopping: answering the admin requests accepted"; "requests" => answering.len());
    }
    let _ = tokio::time::timeout(REQUEST_WAIT + DRAIN_MORE, answering.wait()).await;
}

/// How long [`drain`] waits beyond a request's own wait.
const DRAIN_MORE: Duration = Duration::from_secs(5);

async fn answer(stream: UnixStream, state: &AppState) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let line = read_request(read).await?;
    let request = std::str::from_utf8(&line)
        .map_err(|e| format!("not UTF-8 ({e})"))
        .and_then(|line| serde_json::from_str::<Request>(line).map_err(|e| e.to_string()));
    let response = match request {
        Err(e) => Response::Error(format!("not an admin request: {e}")),
        Ok(Request::CreateKey { email, label }) => match create_key_here(&state.store, email, &label).await {
            Ok(key) => Response::Key(key),
            Err(e) => Response::Error(format!("{e:#}")),
        },
    };
    let mut out = serde_json::to_string(&response)?;
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    Ok(())
}

/// The request line a client sends, if it comes within [`REQUEST_WAIT`]
/// (its bytes: one that is not UTF-8 is answered as refused).
async fn read_request(read: impl tokio::io::AsyncRead + Unpin) -> anyhow::Result<Vec<u8>> {
    let mut line = Vec::new();
    tokio::time::timeout(REQUEST_WAIT, BufReader::new(read.take(MAX_REQUEST)).read_until(b'\n', &mut line))
        .await
        .map_err(|_| anyhow::anyhow!("no request within {REQUEST_WAIT:?}; connection closed"))??;
    Ok(line)
}

async fn create_key_here(store: &crate::store::Store, email: String, label: &str) -> anyhow::Result<String> {
    let (email, label) = checked(&email, label)?;
    let raw = crate::users::create_key_for_email(store, email, label).await.context("creating the key")?;
    Ok(raw.expose())
}

/// The email (as `users::email` keeps it) and the label of a key to make,
/// if both are acceptable.
fn checked(email: &str, label: &str) -> anyhow::Result<(String, ApiKeyLabel)> {
    let label = ApiKeyLabel::parse(label)?;
    let email = crate::users::email(email).map_err(|e| anyhow::anyhow!("--user: {e}"))?;
    Ok((email, label))
}

/// `sparring admin create-key`: a key for the user with this email (made
/// if needed), through the server running on `data_dir` if there is one.
/// Returns the raw key, to show once.
pub async fn create_key(data_dir: &Path, email: String, label: String) -> anyhow::Result<String> {
    // Refuse bad input before looking for a server (which checks it too).
    let (email, _) = checked(&email, &label)?;
    crate::require_data_dir(data_dir)?;
    match crate::try_lock_data_dir(data_dir)? {
        Some(_lock) => {
            let store = crate::open_store_saying_so(data_dir)?;
            let key = create_key_here(&store, email, &label).await?;
            crate::leave_database_whole(&store).await;
            Ok(key)
        }
        None => ask(data_dir, &Request::CreateKey { email, label }).await,
    }
}

/// Sends a request to the server holding `data_dir` and returns its key.
async fn ask(data_dir: &Path, request: &Request) -> anyhow::Result<String> {
    let path = data_dir.join(SOCKET_FILE);
    let stream = UnixStream::connect(&path).await.with_context(|| {
        format!("{} is in use by another sparring process, and {} does not answer", data_dir.display(), path.display())
    })?;
    let (read, mut write) = stream.into_split();
    let mut out = serde_json::to_string(request)?;
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    let mut line = String::new();
    tokio::time::timeout(ANSWER_WAIT, BufReader::new(read).read_line(&mut line))
        .await
        .map_err(|_| anyhow::anyhow!("the server did not answer within {ANSWER_WAIT:?}"))?
        .context("reading the server's answer")?;
    match serde_json::from_str::<Response>(&line).with_context(|| format!("the server's answer: {line:?}"))? {
        Response::Key(key) => Ok(key),
        Response::Error(e) => anyhow::bail!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that connects and sends nothing is let go once the wait
    /// is over, and one that sends its line in time is read.
    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_let_go_after_the_wait() {
        let (server_end, _client_end) = UnixStream::pair().unwrap();
        let started = tokio::time::Instant::now();
        // Bounded here too, so that without the wait the test fails rather than hangs.
        let read = tokio::time::timeout(REQUEST_WAIT * 2, read_request(server_end)).await;
        let err = read.expect("the server still waits for the request").unwrap_err();
        assert!(err.to_string().contains("no request within"), "{err}");
        assert_eq!(started.elapsed(), REQUEST_WAIT);

        let (server_end, mut client_end) = UnixStream::pair().unwrap();
        client_end.write_all(b"{\"create_key\":{}}\n").await.unwrap();
        assert_eq!(read_request(server_end).await.unwrap(), b"{\"create_key\":{}}\n");
    }
}
