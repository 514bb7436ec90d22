//! The server's log: records are written on a thread of their own, so a
//! request never waits for stderr.
//!
//! That thread writes in batches. While records keep coming it writes what
//! has come, sleeps [`LOG_PAUSE`], and writes again; only a quiet server's
//! log thread waits on the channel to be woken by the next record. The JSON
//! log gathers a batch's records and writes them in few system calls
//! ([`Lines`]).
//! slog-async's thread, which this replaces, waited for each next record in
//! the channel's backoff (spinning, then `sched_yield`) before sleeping, so
//! under load it stayed runnable, one more thread beside the runtime's
//! workers and the load's clients on two cores: a page of API keys at 64
//! connections had a p99 of 3.1–5.0 ms with it, 2.5–2.7 ms with no request
//! logged at all, and 2.3–3.1 ms logged in batches (BENCHMARKS.md).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// How long dropping the last logger waits for its thread to write what is
/// queued: at most [`LOG_BACKLOG`] records, a few MB, which a read output
/// (a file, a terminal, a log collector's pipe) takes in milliseconds. An
/// output nobody reads (a full pipe) would hold the write, and with it the
/// process's exit, forever: past this, what is left is dropped and the
/// thread writes nothing more.
pub const LOG_DRAIN_WAIT: Duration = Duration::from_secs(2);

/// The server's logger over `drain`, which runs on a thread of its own
/// behind a channel of [`LOG_BACKLOG`] records; public so that the
/// benchmark's baseline logs exactly as the server does. Dropping the last
/// clone of the logger writes what is queued and ends the thread (waiting
/// [`LOG_DRAIN_WAIT`] at most).
pub fn logger<D>(drain: D) -> slog::Logger
where
    D: Drain<Err = Never, Ok = ()> + Send + 'static,
{
    slog::Logger::root(Batched::spawn(drain, pause, || ()), slog::o!())
}

/// `log` without the record dropshot writes when the server's
/// [`sparring_server::known_routes`] refuses a request (a path or method no
/// route takes): at error level, where nothing went wrong, and said again by
/// the request's own record (its status and the router's reason).
pub fn without_route_refusals(log: &slog::Logger) -> slog::Logger {
    let refusal = |r: &Record<'_>| {
        r.level() == slog::Level::Error && r.msg().as_str() == Some(sparring_server::REFUSAL_LOG_MESSAGE)
    };
    slog::Logger::root(slog::Filter::new(log.clone(), move |r: &Record<'_>| !refusal(r)).ignore_res(), slog::o!())
}

fn pause() {
    std::thread::sleep(LOG_PAUSE)
}

/// The logger of `sparring serve --log-format json`: bunyan JSON on stderr,
/// a batch's records gathered into few `write`s ([`Lines`]). Also the
/// benchmark's baseline's.
pub fn json_to_stderr() -> slog::Logger {
    json_to(std::io::stderr(), pause)
}

/// Bunyan JSON to `out` through [`Lines`], the thread pausing with `pause`.
fn json_to<W, P>(out: W, pause: P) -> slog::Logger
where
    W: Write + Send + 'static,
    P: FnMut() + Send + 'static,
{
    let lines = Lines::new(out);
    let batch_end = lines.clone();
    // slog-json writes a record in many small pieces and, with `set_flush`,
    // flushes after its last: `Lines` takes that flush for the record's end.
    // The pieces gather in a `BufWriter` first, so `Lines` is locked twice a
    // record rather than once a piece (~30).
    let pieces = std::io::BufWriter::with_capacity(WRITE_AT_MOST, lines);
    let drain = slog_bunyan::with_name("sparring", pieces).set_flush(true).build().fuse();
    slog::Logger::root(Batched::spawn(drain, pause, move || batch_end.write_out()), slog::o!())
}

/// At most this many bytes of records go out in one `write`, unless one
/// record alone is longer: `PIPE_BUF`, below which a write to a pipe is
/// never split, so a record never has another writer's bytes (a panic's
/// message) in its middle.
const WRITE_AT_MOST: usize = 4096;

/// A writer that keeps whole records until the log's thread ends a batch
/// (or they pass [`WRITE_AT_MOST`]), then writes them in one call.
///
/// With one `write` per record, the log's thread took 2.1 µs a request under
/// `cargo xtask bench api`'s mix, writing to a file; with ~10 records a
/// `write`, 1.8 (the baseline's 1.55 and 1.28; BENCHMARKS.md). Records are
/// written within the batch that logged them, so no later than they were
/// before, and nothing is written but whole records.
/// Shared between the drain that writes into it and the log's thread, which
/// ends each batch: both on that one thread, so its lock is never waited for.
struct Lines<W: Write>(Arc<Mutex<Gathered<W>>>);

struct Gathered<W> {
    out: W,
    pending: Vec<u8>,
    /// `pending[..complete]` are whole records.
    complete: usize,
}

impl<W: Write> Clone for Lines<W> {
    fn clone(&self) -> Self {
        Lines(self.0.clone())
    }
}

impl<W: Write> Lines<W> {
    fn new(out: W) -> Self {
        Lines(Arc::new(Mutex::new(Gathered { out, pending: Vec::with_capacity(2 * WRITE_AT_MOST), complete: 0 })))
    }

    fn gathered(&self) -> std::sync::MutexGuard<'_, Gathered<W>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes every whole record kept (the end of a batch).
    fn write_out(&self) {
        let mut g = self.gathered();
        let complete = g.complete;
        g.write_first(complete);
        let _ = g.out.flush();
    }
}

impl<W: Write> Gathered<W> {
    /// Writes `pending[..n]` and forgets it. A log that cannot be written
    /// (a full disk, a closed pipe) is not a reason to stop serving, nor to
    /// stop logging: what could not be written is dropped, and the next
    /// records are written as usual. (An error given back to slog would
    /// make its `fuse` end the log's thread, and every record after it
    /// would be lost.)
    fn write_first(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let _ = self.out.write_all(&self.pending[..n]);
        self.pending.drain(..n);
        self.complete -= n;
    }

    /// A record ended at the end of `pending`.
    fn record_ended(&mut self) {
        if self.pending.len() > WRITE_AT_MOST {
            // With the new record the kept ones would pass the limit: they
            // go first, then the new one alone if it is that long itself.
            let before = self.complete;
            self.write_first(before);
            if self.pending.len() >= WRITE_AT_MOST {
                self.complete = self.pending.len();
                self.write_first(self.complete);
                return;
            }
        }
        self.complete = self.pending.len();
    }
}

impl<W: Write> Write for Lines<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.gathered().pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    /// The end of a record (see [`json_to`]), not a request to write it now.
    fn flush(&mut self) -> std::io::Result<()> {
        self.gathered().record_ended();
        Ok(())
    }
}

/// The drain the logger's callers log to: each record, made owned, goes on
/// the channel to the log's thread ([`write_batches`]), or is counted as
/// dropped if the channel is full.
struct Batched {
    /// `None` once dropped (the log's thread then ends).
    records: Option<Sender<AsyncRecord>>,
    dropped: Arc<AtomicUsize>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Closed when the thread ends.
    ended: Receiver<()>,
    /// Set when a drop gave up waiting for the thread: it writes nothing
    /// more.
    abandoned: Arc<AtomicBool>,
}

impl Batched {
    /// `pause` is what the thread does between two batches (sleeps
    /// [`LOG_PAUSE`]); `batch_end` what it does after writing each batch to
    /// `drain` (writes out what [`Lines`] kept).
    fn spawn<D, P, E>(drain: D, mut pause: P, mut batch_end: E) -> Self
    where
        D: Drain<Err = Never, Ok = ()> + Send + 'static,
        P: FnMut() + Send + 'static,
        E: FnMut() + Send + 'static,
    {
        let (records, received) = crossbeam_channel::bounded(LOG_BACKLOG);
        let dropped = Arc::new(AtomicUsize::new(0));
        let counted = dropped.clone();
        let (ending, ended) = crossbeam_channel::bounded::<()>(0);
        let abandoned = Arc::new(AtomicBool::new(false));
        let given_up = abandoned.clone();
        let thread = std::thread::Builder::new()
            .name("sparring-log".into())
            .spawn(move || {
                // Dropped last, after the drain: the thread is done.
                let _ending = ending;
                let drain = drain;
                write_batches(&drain, &received, &counted, &given_up, &mut pause, &mut batch_end);
            })
            .expect("the log's thread starts");
        Batched { records: Some(records), dropped, thread: Mutex::new(Some(thread)), ended, abandoned }
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
        let Some(thread) = self.thread.get_mut().unwrap_or_else(|p| p.into_inner()).take() else { return };
        match self.ended.recv_timeout(LOG_DRAIN_WAIT) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                // Stuck in a write nobody reads: left to end with the
                // process, dropping what it holds once (if ever) the write
                // returns.
                self.abandoned.store(true, Ordering::SeqCst);
            }
            _ => {
                let _ = thread.join();
            }
        }
    }
}

/// The log's thread: waits for a record while none comes; once one does,
/// writes everything queued, pauses, and goes on so until a pause ends with
/// nothing queued. Ends when the channel is closed and empty, or as soon
/// as it finds itself `abandoned` (see [`LOG_DRAIN_WAIT`]).
fn write_batches<D: Drain<Err = Never, Ok = ()>>(
    drain: &D,
    records: &Receiver<AsyncRecord>,
    dropped: &AtomicUsize,
    abandoned: &AtomicBool,
    pause: &mut impl FnMut(),
    batch_end: &mut impl FnMut(),
) {
    let abandoned = || abandoned.load(Ordering::SeqCst);
    while let Ok(first) = records.recv() {
        if abandoned() {
            return;
        }
        let _ = first.log_to(drain);
        loop {
            for record in records.try_iter() {
                if abandoned() {
                    return;
                }
                let _ = record.log_to(drain);
            }
            if abandoned() {
                return;
            }
            report_dropped(drain, dropped);
            batch_end();
            pause();
            if records.is_empty() {
                break;
            }
        }
    }
    if abandoned() {
        return;
    }
    report_dropped(drain, dropped);
    batch_end();
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

    /// Keeps each `write` it is given, as one string.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<String>>>);

    impl std::io::Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(String::from_utf8(buf.to_vec()).unwrap());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A JSON log whose thread, between two batches, pauses until the test
    /// resumes it.
    struct Paused {
        pauses: Receiver<()>,
        /// Before `log`, so dropped first (also when an assertion fails):
        /// the pause then ends and dropping `log` does not wait for it.
        resumes: Option<Sender<()>>,
        log: slog::Logger,
    }

    impl Paused {
        fn json_to(out: impl std::io::Write + Send + 'static) -> Paused {
            let (paused, pauses) = mpsc::channel::<()>();
            let (resumes, resumed) = mpsc::channel::<()>();
            let pause = move || {
                let _ = paused.send(());
                let _ = resumed.recv_timeout(Duration::from_secs(30));
            };
            Paused { pauses, resumes: Some(resumes), log: super::json_to(out, pause) }
        }

        /// Until the thread pauses.
        fn wait(&self) {
            self.pauses.recv_timeout(Duration::from_secs(30)).expect("the thread pauses");
        }

        fn resume(&self) {
            self.resumes.as_ref().expect("not finished").send(()).unwrap();
        }

        /// Pauses end at once from here on; the log is dropped, its thread
        /// writing what is queued.
        fn finish(mut self) {
            self.resumes = None;
        }
    }

    /// The JSON log writes a batch's records together, in writes of whole
    /// records of at most `WRITE_AT_MOST` bytes (unless one record is
    /// longer), in order, and writes each batch before its pause.
    #[test]
    fn a_batch_of_json_records_goes_out_in_few_writes_of_whole_records() {
        let writes = Writes::default();
        let paused = Paused::json_to(writes.clone());
        let log = &paused.log;
        slog::info!(log, "first");
        paused.wait();
        // Written before the pause, alone.
        assert_eq!(writes.0.lock().unwrap().len(), 1);
        // These come while the thread pauses: one batch once it resumes.
        let long = "x".repeat(2 * super::WRITE_AT_MOST);
        for i in 0..40 {
            slog::info!(log, "request completed"; "n" => i);
        }
        slog::info!(log, "long"; "text" => &long);
        for i in 40..80 {
            slog::info!(log, "request completed"; "n" => i);
        }
        paused.resume();
        paused.wait();
        let batch: Vec<String> = writes.0.lock().unwrap()[1..].to_vec();
        let lines: Vec<serde_json::Value> =
            batch.concat().lines().map(|l| serde_json::from_str(l).expect("a whole JSON record")).collect();
        let ns: Vec<u64> = lines.iter().filter_map(|l| l["n"].as_u64()).collect();
        assert_eq!(ns, (0..80).collect::<Vec<u64>>(), "every record, in order");
        assert_eq!(lines.iter().filter(|l| l["text"] == long.as_str()).count(), 1);
        for w in &batch {
            assert!(w.ends_with('\n'), "a write ends a record: {w:?}");
            assert!(
                w.len() <= super::WRITE_AT_MOST || w.lines().count() == 1,
                "{} bytes in {} records",
                w.len(),
                w.lines().count()
            );
        }
        // 81 records of ~300 bytes and one of 8 KB: the long one alone, the
        // others in writes of up to 4 KB each.
        let bytes: usize = batch.iter().map(String::len).sum::<usize>() - long.len();
        assert!(
            batch.len() <= 2 + 2 * bytes / super::WRITE_AT_MOST + 1,
            "{} writes for {} records",
            batch.len(),
            lines.len()
        );
        paused.finish();
    }

    /// Fails its first `failing` writes (a full disk), then keeps them.
    struct FailsAtFirst {
        failing: usize,
        kept: Writes,
    }

    impl std::io::Write for FailsAtFirst {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.failing > 0 {
                self.failing -= 1;
                return Err(std::io::Error::from_raw_os_error(28));
            }
            self.kept.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Writes that fail (in the middle of a batch and at its end) lose
    /// their records only: the log's thread goes on, and what is logged
    /// once writes work again is written.
    #[test]
    fn a_log_that_cannot_be_written_for_a_while_loses_only_those_records() {
        let kept = Writes::default();
        let paused = Paused::json_to(FailsAtFirst { failing: 3, kept: kept.clone() });
        let log = &paused.log;
        slog::info!(log, "first");
        paused.wait();
        // ~12 KB while the thread pauses: writes in the middle of the batch
        // and at its end, the first of them failing.
        for i in 0..40 {
            slog::info!(log, "while full"; "n" => i);
        }
        paused.resume();
        paused.wait();
        paused.resume();
        slog::info!(log, "after"; "n" => 1000);
        paused.finish();
        let written = kept.0.lock().unwrap().concat();
        let lines: Vec<serde_json::Value> = written.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(lines.iter().any(|l| l["n"] == 1000), "the record after the failures was not written:\n{written}");
        assert!(lines.len() < 42, "the failed writes' records were written after all: {}", lines.len());
    }

    /// A writer nobody reads (stderr a full pipe): its first `write` says
    /// so and blocks until the test lets it go; it keeps what it is given,
    /// and says when it is dropped (its log thread ended).
    struct Unread {
        blocked: Sender<()>,
        let_go: Receiver<()>,
        kept: Writes,
        gone: Sender<()>,
    }

    impl std::io::Write for Unread {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.kept.0.lock().unwrap().is_empty() {
                let _ = self.blocked.send(());
                // Bounded, so that a drop that waits for it fails the test
                // rather than hang it.
                let _ = self.let_go.recv_timeout(Duration::from_secs(60));
            }
            self.kept.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Drop for Unread {
        fn drop(&mut self) {
            let _ = self.gone.send(());
        }
    }

    /// Dropping the last logger while its output is not read (a full pipe
    /// on stderr) returns, rather than wait for the write forever and keep
    /// the process from exiting; what was still queued is dropped, and the
    /// thread, let go later, writes nothing more. (Records queued while
    /// the output is read are all written: the tests above.)
    #[test]
    fn dropping_the_log_while_its_output_is_not_read_returns() {
        let (blocked, blocks) = mpsc::channel();
        let (let_go, held) = mpsc::channel();
        let (gone, goes) = mpsc::channel();
        let kept = Writes::default();
        let log = super::json_to(Unread { blocked, let_go: held, kept: kept.clone(), gone }, super::pause);
        slog::info!(log, "first");
        blocks.recv_timeout(Duration::from_secs(30)).expect("the first write");
        for i in 0..100 {
            slog::info!(log, "queued"; "n" => i);
        }
        let (dropped, drops) = mpsc::channel();
        std::thread::spawn(move || {
            drop(log);
            let _ = dropped.send(());
        });
        drops.recv_timeout(Duration::from_secs(30)).expect("dropping the log returns while its write is blocked");
        let_go.send(()).unwrap();
        goes.recv_timeout(Duration::from_secs(30)).expect("the log's thread ends once its write returns");
        let written = kept.0.lock().unwrap().concat();
        assert_eq!(written.lines().count(), 1, "written after the drop gave up on them:\n{written}");
        assert!(written.contains("\"first\""), "{written}");
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
    fn only_dropshot_s_record_of_a_route_refusal_is_left_out() {
        let (sent, messages) = mpsc::channel();
        let log = super::without_route_refusals(&slog::Logger::root(Sent(sent), slog::o!()));
        // As dropshot logs it (`REFUSAL_LOG_MESSAGE`, written out).
        slog::error!(log, "failed to determine request API version"; "error" => "404");
        slog::warn!(log, "failed to determine request API version");
        slog::error!(log, "request failed"; "n" => 1);
        slog::info!(log, "request completed"; "n" => 2);
        drop(log);
        let written: Vec<String> = messages.iter().collect();
        assert_eq!(written, ["failed to determine request API version", "request failed", "request completed"]);
        assert_eq!(sparring_server::REFUSAL_LOG_MESSAGE, "failed to determine request API version");
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
        let log = slog::Logger::root(Batched::spawn(Sent(sent), pause, || ()), slog::o!());
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
