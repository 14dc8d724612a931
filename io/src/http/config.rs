//! Limits and timeouts of the HTTP/1.1 server, with their defaults as named constants.

use std::time::Duration;

use sortie_core::config::ServerLimitsConfig;
use sortie_core::h1::HeadLimits;
use sortie_core::limits;

/// Default time allowed for a whole request head, counted from its first byte (slowloris);
/// `control.server.header_timeout_ms`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration =
    Duration::from_millis(limits::DEFAULT_HEADER_TIMEOUT_MS);
/// Default time a keep-alive connection may sit idle between requests;
/// `control.server.idle_timeout_ms`.
pub const DEFAULT_IDLE_TIMEOUT: Duration =
    Duration::from_millis(limits::DEFAULT_SERVER_IDLE_TIMEOUT_MS);
/// Default time allowed without any request body byte arriving while a body is read;
/// `control.server.body_timeout_ms`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration =
    Duration::from_millis(limits::DEFAULT_BODY_TIMEOUT_MS);
/// Default time one write of a response (or `100 Continue`) may make no progress before the
/// client is considered gone; `control.server.write_timeout_ms`.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_millis(limits::DEFAULT_WRITE_TIMEOUT_MS);
/// Default time in-flight connections get to finish after shutdown begins.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Default time spent discarding input after a response that closes the connection, so that
/// unread request bytes do not turn the close into a reset that destroys the response.
pub const DEFAULT_LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// Default number of connections one core serves at once; beyond it, new connections are
/// answered 503 and closed; `control.server.max_connections_per_core`.
pub const DEFAULT_MAX_CONNECTIONS: usize = limits::DEFAULT_MAX_CONNECTIONS_PER_CORE;
/// Default number of unread request body bytes the server discards to keep a connection alive
/// after a handler answered without reading the whole body. Past it, the connection is closed.
pub const DEFAULT_MAX_DRAIN_BYTES: u64 = 64 * 1024;
/// Default time a request runs before the server starts watching for its client leaving: the
/// watch costs system calls, which requests answered sooner never pay.
pub const DEFAULT_DEPARTURE_WATCH_AFTER: Duration = Duration::from_millis(10);
/// Body limit of a handler that does not choose one.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;

/// Settings of one listener's HTTP/1.1 server, shared by its connections on one core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Limits of a request head: bytes, header count, target length.
    pub head_limits: HeadLimits,
    /// Time allowed for a whole request head, from its first byte; then 408 and close.
    pub header_read_timeout: Duration,
    /// Time a keep-alive connection may wait for the next request; then it is closed.
    pub idle_timeout: Duration,
    /// Time allowed between two reads of request body bytes; then 408 and close.
    pub body_read_timeout: Duration,
    /// Time one write may make no progress (the client does not read); then the connection is
    /// closed.
    pub write_timeout: Duration,
    /// Connections served at once by one accept loop (per core).
    pub max_connections: usize,
    /// Time in-flight connections get after shutdown begins; then they are closed.
    pub shutdown_grace: Duration,
    /// Time spent discarding input after a closing response.
    pub linger_timeout: Duration,
    /// Unread body bytes discarded to keep a connection alive after the handler returned.
    pub max_drain_bytes: u64,
    /// Time a handler runs before the server watches for its client leaving (a close, reset or
    /// half-close), which drops the handler.
    pub departure_watch_after: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            head_limits: HeadLimits::REQUEST,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            linger_timeout: DEFAULT_LINGER_TIMEOUT,
            max_drain_bytes: DEFAULT_MAX_DRAIN_BYTES,
            departure_watch_after: DEFAULT_DEPARTURE_WATCH_AFTER,
        }
    }
}

impl ServerConfig {
    /// The defaults with the `[control.server]` keys applied.
    pub fn from_limits(l: &ServerLimitsConfig) -> ServerConfig {
        ServerConfig {
            header_read_timeout: Duration::from_millis(l.header_timeout_ms),
            idle_timeout: Duration::from_millis(l.idle_timeout_ms),
            body_read_timeout: Duration::from_millis(l.body_timeout_ms),
            write_timeout: Duration::from_millis(l.write_timeout_ms),
            max_connections: l.max_connections_per_core,
            shutdown_grace: Duration::from_millis(l.drain_timeout_ms),
            ..ServerConfig::default()
        }
    }
}

/// Server limits a reload may replace (decision 114): every accept loop takes the current ones
/// for each connection it accepts, so connections accepted after a reload get the new limits
/// and those before keep theirs. Checking costs one atomic load per accepted connection.
#[derive(Clone, Debug)]
pub struct LiveServerConfig {
    inner: std::sync::Arc<LiveInner>,
}

#[derive(Debug)]
struct LiveInner {
    generation: std::sync::atomic::AtomicU64,
    config: std::sync::Mutex<ServerConfig>,
}

impl LiveServerConfig {
    /// Limits that start as `config`.
    pub fn new(config: ServerConfig) -> LiveServerConfig {
        LiveServerConfig {
            inner: std::sync::Arc::new(LiveInner {
                generation: std::sync::atomic::AtomicU64::new(0),
                config: std::sync::Mutex::new(config),
            }),
        }
    }

    /// Replaces the limits for connections accepted from now on.
    pub fn replace(&self, config: ServerConfig) {
        *self
            .inner
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config;
        self.inner
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// The limits in force.
    pub fn get(&self) -> ServerConfig {
        self.inner
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn generation(&self) -> u64 {
        self.inner
            .generation
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

/// One core's view of a [`LiveServerConfig`]: the current limits, copied again only when a
/// reload replaced them.
#[derive(Debug)]
pub struct CoreServerConfig {
    live: LiveServerConfig,
    cached: std::cell::RefCell<(u64, std::rc::Rc<ServerConfig>)>,
}

impl CoreServerConfig {
    /// This core's view of `live`.
    pub fn new(live: LiveServerConfig) -> CoreServerConfig {
        let cached = (live.generation(), std::rc::Rc::new(live.get()));
        CoreServerConfig {
            live,
            cached: std::cell::RefCell::new(cached),
        }
    }

    /// A fixed configuration that no reload changes.
    pub fn fixed(config: ServerConfig) -> CoreServerConfig {
        CoreServerConfig::new(LiveServerConfig::new(config))
    }

    /// The limits in force.
    pub fn current(&self) -> std::rc::Rc<ServerConfig> {
        let generation = self.live.generation();
        let mut cached = self.cached.borrow_mut();
        if cached.0 != generation {
            *cached = (generation, std::rc::Rc::new(self.live.get()));
        }
        std::rc::Rc::clone(&cached.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_sees_replaced_limits_from_its_next_look() {
        let live = LiveServerConfig::new(ServerConfig::default());
        let core = CoreServerConfig::new(live.clone());
        let before = core.current();
        assert!(
            std::rc::Rc::ptr_eq(&before, &core.current()),
            "no copy without a reload"
        );
        live.replace(ServerConfig {
            max_connections: 3,
            ..ServerConfig::default()
        });
        assert_eq!(core.current().max_connections, 3);
        assert_eq!(before.max_connections, DEFAULT_MAX_CONNECTIONS);
    }

    #[test]
    fn defaults_are_the_named_constants() {
        let c = ServerConfig::default();
        assert_eq!(c.head_limits, HeadLimits::REQUEST);
        assert_eq!(c.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(c.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        assert_eq!(c.body_read_timeout, DEFAULT_BODY_READ_TIMEOUT);
        assert_eq!(c.write_timeout, DEFAULT_WRITE_TIMEOUT);
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
        assert_eq!(c.linger_timeout, DEFAULT_LINGER_TIMEOUT);
        assert_eq!(c.max_drain_bytes, DEFAULT_MAX_DRAIN_BYTES);
        assert_eq!(c.departure_watch_after, DEFAULT_DEPARTURE_WATCH_AFTER);
        // The slowloris bound must be shorter than the keep-alive idle bound.
        assert!(c.header_read_timeout < c.idle_timeout);
        assert_eq!(ServerConfig::from_limits(&ServerLimitsConfig::default()), c);
    }
}
