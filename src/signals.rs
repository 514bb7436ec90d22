//! The signals that ask the process to stop (SIGINT, SIGTERM).
//!
//! On unix they are listened to from the moment [`Interrupts::listen`] is
//! called, not from the first wait (elsewhere, Ctrl-C is, from the first
//! wait): one that comes in between is kept for that wait. Listening only
//! at the wait left a window in which SIGTERM took its default action and
//! killed the process without a graceful shutdown
//! (`sparring serve` logged "serving" just before it began to listen).

pub(crate) struct Interrupts {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
    /// One already received and not yet acted on.
    pending: Option<&'static str>,
}

impl Interrupts {
    /// Starts listening. Must be called on the runtime.
    pub(crate) fn listen() -> Interrupts {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Interrupts {
                signals: signal(SignalKind::interrupt()).ok().zip(signal(SignalKind::terminate()).ok()),
                pending: None,
            }
        }
        #[cfg(not(unix))]
        Interrupts { pending: None }
    }

    /// Resolves when one arrives, with its name.
    pub(crate) async fn recv(&mut self) -> &'static str {
        if let Some(signal) = self.pending.take() {
            return signal;
        }
        #[cfg(unix)]
        if let Some((int, term)) = &mut self.signals {
            return tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }

    /// One received and not acted on yet, if any, without waiting.
    pub(crate) fn received(&mut self) -> Option<&'static str> {
        futures::FutureExt::now_or_never(self.recv())
    }

    /// Keeps `signal`, received and not acted on yet, for the next
    /// [`Interrupts::recv`].
    pub(crate) fn put_back(&mut self, signal: &'static str) {
        self.pending = Some(signal);
    }
}
