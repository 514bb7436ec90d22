//! What the engine tests share: the reference agent as a child process,
//! a loopback stand-in for an LLM's chat-completions endpoint, a webhook
//! receiver, and waiting for a batch run to end.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use super::process::Proc;
use super::TestServer;

/// `sparring agent` on a free loopback port.
pub struct Agent {
    pub proc: Proc,
    pub base: String,
}

impl Agent {
    pub fn start(args: &[&str]) -> Agent {
        let mut all = vec!["agent", "--bind", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let proc = Proc::spawn(&all);
        proc.expect("the agent to listen", |o| o.stdout.contains("listening on http://"));
        let stdout = proc.stdout();
        let line = stdout.lines().find(|l| l.contains("listening on http://")).unwrap();
        let base = line[line.find("http://").unwrap()..].trim().to_string();
        Agent { proc, base }
    }

    pub fn http_target(&self) -> String {
        format!("{}/http", self.base)
    }

    pub fn ws_target(&self) -> String {
        format!("{}/ws", self.base.replacen("http://", "ws://", 1))
    }

    pub async fn stats(&self) -> Value {
        reqwest::get(format!("{}/stats", self.base)).await.unwrap().json().await.unwrap()
    }
}

/// Polls the batch run until it has ended (or the deadline passes).
pub async fn wait_for_end(s: &TestServer, key: &str, batch_run_id: &str) -> Value {
    wait_for_end_at(&s.base, key, batch_run_id).await
}

pub async fn wait_for_end_at(base: &str, key: &str, batch_run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    let http = reqwest::Client::new();
    loop {
        let run: Value = http
            .get(format!("{base}/v1/batch-runs/{batch_run_id}"))
            .header("x-api-key", key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let status = run["status"].as_str().unwrap_or_default();
        if !matches!(status, "queued" | "running") {
            return run;
        }
        assert!(Instant::now() < deadline, "batch run {batch_run_id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every item of a paginated list, read a few at a time, so that the tests
/// reading lists this way follow their cursors too.
pub async fn all_pages(s: &TestServer, key: &str, path: &str, field: &str) -> Vec<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    super::items_of_pages(s, key, &format!("{path}{sep}limit=3"), field).await
}

/// A project with a channel to `target`, ready for scenarios and tests.
pub async fn channel(s: &TestServer, key: &str, project_id: &str, kind: &str, target: &str) -> String {
    let body = json!({"project_id": project_id, "name": format!("{kind} {target}"), "kind": kind, "target": target,
                      "turn_timeout_ms": 3000});
    s.expect(Method::POST, "/v1/channels", key, Some(body), 200).await["id"].as_str().unwrap().to_string()
}

pub async fn create(s: &TestServer, key: &str, path: &str, body: Value) -> String {
    s.expect(Method::POST, path, key, Some(body), 200).await["id"].as_str().unwrap().to_string()
}

/// What a recording loopback server received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

type Responder = dyn Fn(&Received, usize) -> (u16, String) + Send + Sync;

/// A loopback HTTP server that records every request and answers with
/// `respond(request, index)`: the test's own stand-in for services outside
/// the machine (an LLM's chat-completions endpoint, a webhook receiver). A
/// 3xx answer's body is its `location`.
pub struct Recorder {
    pub base: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    pub async fn start(respond: impl Fn(&Received, usize) -> (u16, String) + Send + Sync + 'static) -> Recorder {
        use http_body_util::BodyExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let respond: Arc<Responder> = Arc::new(respond);
        let log = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let log = log.clone();
                let respond = respond.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        let respond = respond.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or_default().to_string()))
                                .collect();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let got = Received { path, headers, body: String::from_utf8_lossy(&body).into_owned() };
                            let index = {
                                let mut log = log.lock().unwrap();
                                log.push(got.clone());
                                log.len() - 1
                            };
                            let (status, body) = respond(&got, index);
                            let answer = hyper::Response::builder().status(status);
                            let (answer, body) = if (300..400).contains(&status) {
                                (answer.header("location", body), String::new())
                            } else {
                                (answer.header("content-type", "application/json"), body)
                            };
                            Ok::<_, std::convert::Infallible>(
                                answer.body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Recorder { base, received, task }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A webhook receiver that takes each request whole and answers it only
/// with a status the test then gives: its URL, each request's arrival (its
/// path), and where the answers go.
pub async fn held_receiver(
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>, tokio::sync::mpsc::UnboundedSender<u16>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let (answer, answers) = tokio::sync::mpsc::unbounded_channel::<u16>();
    let answers = std::sync::Arc::new(tokio::sync::Mutex::new(answers));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (arrived, answers) = (arrived.clone(), answers.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (arrived, answers) = (arrived.clone(), answers.clone());
                    async move {
                        use http_body_util::BodyExt as _;
                        let path = req.uri().path().to_string();
                        let _ = req.into_body().collect().await;
                        let _ = arrived.send(path);
                        let status = answers.lock().await.recv().await.unwrap_or(500);
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, arrivals, answer)
}

/// A chat-completions answer whose content is `content`.
pub fn completion(content: &str) -> String {
    json!({"id": "chatcmpl-1", "object": "chat.completion",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})
    .to_string()
}

/// A chat-completions endpoint (an LLM: a stand-in on loopback). Under
/// `/caller` it plays the caller: one line (a booking), then done, without
/// last words (the caller hangs up). Under `/nonsense` it answers what is
/// no verdict. Anywhere else it judges, answering `verdict` (the judge's
/// JSON).
pub async fn chat_llm(verdict: &'static str) -> Recorder {
    Recorder::start(move |req, _| {
        let body: Value = serde_json::from_str(&req.body).unwrap_or_default();
        let lines = body["messages"].as_array().map(|m| m.len()).unwrap_or(0);
        if req.path.starts_with("/caller") {
            let said = if lines <= 3 {
                json!({"say": "I'd like to book an appointment on Tuesday at 3 pm.", "done": false})
            } else {
                json!({"done": true})
            };
            (200, completion(&said.to_string()))
        } else if req.path.starts_with("/nonsense") {
            (200, completion("I think it went fine, probably."))
        } else {
            (200, completion(verdict))
        }
    })
    .await
}

/// One websocket call as the agent's side sees it: the test's own loopback
/// agent, for replies the reference agent never gives.
pub type WsPeer = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A websocket agent on a free loopback port: `handler` holds each call
/// (the frames Sparring sends, the frames it answers). Its `target` is the
/// channel's `ws://` URL.
pub struct WsAgent {
    pub target: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WsAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WsAgent {
    pub async fn start<F, Fut>(handler: F) -> WsAgent
    where
        F: Fn(WsPeer) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("ws://{}/ws", listener.local_addr().unwrap());
        let handler = Arc::new(handler);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let handler = handler.clone();
                tokio::spawn(async move {
                    if let Ok(peer) = tokio_tungstenite::accept_async(stream).await {
                        handler(peer).await;
                    }
                });
            }
        });
        WsAgent { target, task }
    }
}

/// The next JSON text frame Sparring sent; `None` once the call is over.
pub async fn ws_recv(peer: &mut WsPeer) -> Option<Value> {
    use futures::StreamExt as _;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match peer.next().await? {
            Ok(Message::Text(text)) => return serde_json::from_str(&text).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Sends one JSON text frame to Sparring.
pub async fn ws_send(peer: &mut WsPeer, frame: Value) {
    use futures::SinkExt as _;
    let _ = peer.send(tokio_tungstenite::tungstenite::Message::text(frame.to_string())).await;
}
