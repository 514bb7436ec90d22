//! The server's log: records are written on a thread of their own, so a
//! request never waits for stderr.
//!
//! That thread writes in batches. While records keep coming it writes what
//! has come, sleeps [`LOG_PAUSE`], and writes again; only a quiet server's
//! log thread waits on the channel to be woken by the next record.
//! slog-async's thread, which this replaces, waited for each next record in
//! the channel's backoff (spinning, then `sched_yield`) before sleeping, so
//! under load it stayed runnable, one more thread beside the runtime's
//! workers and the load's clients on two cores: a page of API keys at 64
//! connections had a p99 of 3.1–5.0 ms with it, 2.5–2.7 ms with no request
//! logged at all, and 2.3–3.1 ms logged in batches (BENCHMARKS.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use slog::{record, Drain, Never, OwnedKVList, Record};
use slog_async::AsyncRecord;

/// Records the log's thread may fall behind by before new ones are dropped
/// (each drop is counted, and the count logged once there is room).
/// slog-async's default of 128 is ~4 ms of requests at 30,000 a second, and
/// on two busy cores the log's thread waits longer than that for its turn:
/// under `cargo xtask bench api`'s mix, 84,164 request records were written
/// for 86,567 requests answered in 3 s, and by the benchmark's baseline
/// 272,754 for 333,699 in 4 s. 8,192 is ~0.3 s of the mix's rate, and ~90
/// times what comes during one [`LOG_PAUSE`] at the baseline's; with it
/// every record was written in both. The channel is allocated up front:
/// ~4 MB of resident memory (measured). Dropping rather than blocking keeps
/// a log reader that stops reading (a paused terminal, a full pipe) from
/// stopping the API.
pub const LOG_BACKLOG: usize = 8192;

/// How long the log's thread pauses between two batches while records keep
/// coming: how late a record may be written, at most, beyond the time it
/// takes to write those before it.
pub const LOG_PAUSE: Duration = Duration::from_millis(1);

/// The server's logger over `drain`, which runs on a thread of its own
/// behind a channel of [`LOG_BACKLOG`] records; public so that the
/// benchmark's baseline logs exactly as the server does. Dropping the last
/// clone of the logger writes what is queued and ends the thread.
pub fn logger<D>(drain: D) -> slog::Logger
where
    D: Drain<Err = Never, Ok = ()> + Send + 'static,
{
    slog::Logger::root(Batched::spawn(drain, || std::thread::sleep(LOG_PAUSE)), slog::o!())
}

/// The logger of `sparring serve --log-format json`: bunyan JSON on stderr,
/// one `write` per record (slog-json writes a record in many small pieces,
/// each a system call on unbuffered stderr). Also the benchmark's
/// baseline's.
pub fn json_to_stderr() -> slog::Logger {
    let stderr = std::io::BufWriter::new(std::io::stderr());
    logger(slog_bunyan::with_name("sparring", stderr).set_flush(true).build().fuse())
}

/// The drain the logger's callers log to: each record, made owned, goes on
/// the channel to the log's thread ([`write_batches`]), or is counted as
/// dropped if the channel is full.
struct Batched {
    /// `None` once dropped (the log's thread then ends).
    records: Option<Sender<AsyncRecord>>,
    dropped: Arc<AtomicUsize>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Batched {
    /// `pause` is what the thread does between two batches (sleeps
    /// [`LOG_PAUSE`]).
    fn spawn<D, P>(drain: D, mut pause: P) -> Self
    where
        D: Drain<Err = Never, Ok = ()> + Send + 'static,
        P: FnMut() + Send + 'static,
    {
        let (records, received) = crossbeam_channel::bounded(LOG_BACKLOG);
        let dropped = Arc::new(AtomicUsize::new(0));
        let counted = dropped.clone();
        let thread = std::thread::Builder::new()
            .name("sparring-log".into())
            .spawn(move || write_batches(&drain, &received, &counted, &mut pause))
            .expect("the log's thread starts");
        Batched { records: Some(records), dropped, thread: Mutex::new(Some(thread)) }
    }
}

impl Drain for Batched {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), Never> {
        // Full, or the log's thread gone (a panic in `drain`): counted.
        if let Some(records) = &self.records {
            if records.try_send(AsyncRecord::from(record, values)).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

impl Drop for Batched {
    fn drop(&mut self) {
        // The channel closed, the thread writes what is queued and ends.
        self.records = None;
        if let Some(thread) = self.thread.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// The log's thread: waits for a record while none comes; once one does,
/// writes everything queued, pauses, and goes on so until a pause ends with
/// nothing queued. Ends when the channel is closed and empty.
fn write_batches<D: Drain<Err = Never, Ok = ()>>(
    drain: &D,
    records: &Receiver<AsyncRecord>,
    dropped: &AtomicUsize,
    pause: &mut impl FnMut(),
) {
    while let Ok(first) = records.recv() {
        let _ = first.log_to(drain);
        loop {
            for record in records.try_iter() {
                let _ = record.log_to(drain);
            }
            report_dropped(drain, dropped);
            pause();
            if records.is_empty() {
                break;
            }
        }
    }
    report_dropped(drain, dropped);
}

/// Logs how many records were dropped since the last report, if any.
fn report_dropped<D: Drain<Err = Never, Ok = ()>>(drain: &D, dropped: &AtomicUsize) {
    let count = dropped.swap(0, Ordering::Relaxed);
    if count > 0 {
        let _ = drain.log(
            &record!(
                slog::Level::Error,
                "",
                &format_args!("the log's thread fell behind: {count} records dropped"),
                slog::b!("count" => count)
            ),
            &OwnedKVList::from(slog::o!()),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{self, Receiver, Sender};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{Batched, LOG_BACKLOG};

    /// Keeps the message of every record it is given, and holds the first
    /// until it is let go: a log thread that waits for a core while
    /// requests go on.
    struct Held {
        seen: Arc<Mutex<Vec<String>>>,
        let_go: Mutex<Receiver<()>>,
    }

    impl slog::Drain for Held {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
            let first = {
                let mut seen = self.seen.lock().unwrap();
                seen.push(record.msg().to_string());
                seen.len() == 1
            };
            if first {
                // Bounded, so that a logger that blocked its callers would
                // fail this test rather than hang it.
                let _ = self.let_go.lock().unwrap().recv_timeout(Duration::from_secs(30));
            }
            Ok(())
        }
    }

    /// Logs `burst` records while the log's thread is held on the first,
    /// then lets it go and drops the logger: the messages written.
    fn burst_while_held(burst: usize) -> Vec<String> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (let_go, held) = mpsc::channel();
        let log = super::logger(Held { seen: seen.clone(), let_go: Mutex::new(held) });
        for i in 0..burst {
            slog::info!(log, "request completed"; "n" => i);
        }
        let_go.send(()).unwrap();
        // The last logger gone, the log's thread writes what is queued and
        // ends; dropping joins it.
        drop(log);
        let seen = seen.lock().unwrap();
        seen.clone()
    }

    /// The counts of dropped records that `written` reports.
    fn reported_drops(written: &[String]) -> Vec<usize> {
        written
            .iter()
            .filter_map(|m| {
                m.strip_prefix("the log's thread fell behind: ")?.strip_suffix(" records dropped")?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn a_burst_while_the_log_thread_waits_loses_no_record() {
        const BURST: usize = 4_000;
        let written = burst_while_held(BURST);
        assert_eq!(reported_drops(&written), Vec::<usize>::new(), "the logger reported dropped records");
        assert_eq!(written.len(), BURST);
    }

    #[test]
    fn records_past_the_backlog_are_dropped_and_counted() {
        const BURST: usize = LOG_BACKLOG + 500;
        let written = burst_while_held(BURST);
        let requests = written.iter().filter(|m| *m == "request completed").count();
        let dropped: usize = reported_drops(&written).iter().sum();
        // The held record and a full channel are written; what came past
        // them is counted, once the thread is let go.
        assert!((LOG_BACKLOG..=LOG_BACKLOG + 1).contains(&requests), "{requests} records written");
        assert_eq!(requests + dropped, BURST, "every record written or counted");
        assert_eq!(written.len(), requests + reported_drops(&written).len());
    }

    /// Sends each record's message.
    struct Sent(Sender<String>);

    impl slog::Drain for Sent {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
            let _ = self.0.send(record.msg().to_string());
            Ok(())
        }
    }

    #[test]
    fn records_that_come_during_a_pause_wait_for_its_end() {
        let (sent, events) = mpsc::channel();
        let (resume, resumed) = mpsc::channel::<()>();
        // A pause that says when it begins and ends, and lasts until the
        // test resumes it.
        let pausing = sent.clone();
        let pause = move || {
            let _ = pausing.send("pause".to_string());
            let _ = resumed.recv_timeout(Duration::from_secs(30));
            let _ = pausing.send("resume".to_string());
        };
        let log = slog::Logger::root(Batched::spawn(Sent(sent), pause), slog::o!());
        let next = || events.recv_timeout(Duration::from_secs(30)).expect("an event");
        slog::info!(log, "first");
        assert_eq!(next(), "first");
        // The log's thread wrote the first record, found nothing more, and
        // pauses.
        assert_eq!(next(), "pause");
        slog::info!(log, "second");
        slog::info!(log, "third");
        resume.send(()).unwrap();
        // Woken by each record, the thread would have written the second
        // and third during the pause.
        assert_eq!([next(), next(), next()], ["resume", "second", "third"]);
        // Pauses end at once from here on, so that dropping the logger
        // does not wait for one.
        drop(resume);
        drop(log);
    }
}
