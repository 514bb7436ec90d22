//! The server's log: records are written on a thread of their own, so a
//! request never waits for stderr.

/// Records the log's thread may fall behind by before new ones are dropped
/// (each drop is counted, and the count logged once there is room).
/// slog-async's default of 128 is ~4 ms of requests at 30,000 a second, and
/// on two busy cores the log's thread waits longer than that for its turn:
/// under `cargo xtask bench api`'s mix, 84,164 request records were written
/// for 86,567 requests answered in 3 s, and by the benchmark's baseline
/// 272,754 for 333,699 in 4 s. 8,192 is ~0.3 s of the mix's rate; with it
/// every record was written in both. The channel is allocated up front:
/// ~4 MB of resident memory (measured). Dropping rather than blocking keeps
/// a log reader that stops reading (a paused terminal, a full pipe) from
/// stopping the API.
pub const LOG_BACKLOG: usize = 8192;

/// The server's logger over `drain`, which runs on a thread of its own
/// behind a channel of [`LOG_BACKLOG`] records; public so that the
/// benchmark's baseline logs exactly as the server does.
pub fn logger<D>(drain: D) -> slog::Logger
where
    D: slog::Drain<Err = slog::Never, Ok = ()> + Send + 'static,
{
    use slog::Drain as _;
    let drain = slog_async::Async::new(drain)
        .chan_size(LOG_BACKLOG)
        .overflow_strategy(slog_async::OverflowStrategy::DropAndReport)
        .build();
    slog::Logger::root(drain.fuse(), slog::o!())
}

/// The logger of `sparring serve --log-format json`: bunyan JSON on stderr,
/// one `write` per record (slog-json writes a record in many small pieces,
/// each a system call on unbuffered stderr). Also the benchmark's
/// baseline's.
pub fn json_to_stderr() -> slog::Logger {
    use slog::Drain as _;
    let stderr = std::io::BufWriter::new(std::io::stderr());
    logger(slog_bunyan::with_name("sparring", stderr).set_flush(true).build().fuse())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{self, Receiver};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Counts the records it is given, and holds the first until it is let
    /// go: a log thread that waits for a core while requests go on.
    struct Held {
        seen: Arc<AtomicUsize>,
        dropped_reported: Arc<AtomicUsize>,
        let_go: Mutex<Receiver<()>>,
    }

    impl slog::Drain for Held {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
            if self.seen.fetch_add(1, Ordering::SeqCst) == 0 {
                // Bounded, so that a logger that blocked its callers would
                // fail this test rather than hang it.
                let _ = self.let_go.lock().unwrap().recv_timeout(Duration::from_secs(30));
            }
            if record.msg().to_string().contains("dropped") {
                self.dropped_reported.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }

    #[test]
    fn a_burst_while_the_log_thread_waits_loses_no_record() {
        const BURST: usize = 4_000;
        let seen = Arc::new(AtomicUsize::new(0));
        let dropped_reported = Arc::new(AtomicUsize::new(0));
        let (let_go, held) = mpsc::channel();
        let log = super::logger(Held {
            seen: seen.clone(),
            dropped_reported: dropped_reported.clone(),
            let_go: Mutex::new(held),
        });
        for i in 0..BURST {
            slog::info!(log, "request completed"; "n" => i);
        }
        let_go.send(()).unwrap();
        // The last logger gone, the log's thread writes what is queued and
        // ends; dropping joins it.
        drop(log);
        assert_eq!(dropped_reported.load(Ordering::SeqCst), 0, "the logger reported dropped records");
        assert_eq!(seen.load(Ordering::SeqCst), BURST);
    }
}
