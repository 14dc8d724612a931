//! HTTP/1.1 server of the request, receipt and admin APIs (and later the forward proxy).
//!
//! DECISIONS-PLACEHOLDER

mod body;
mod config;
mod conn;
mod date;
mod handler;
mod race;
mod request;
mod response;
mod server;
mod shutdown;

pub use body::{Body, BodyError};
pub use config::{
    ServerConfig, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LINGER_TIMEOUT, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_DRAIN_BYTES, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WRITE_TIMEOUT,
};
pub use conn::{
    serve_connection, BODY_READ_BUFFER_BYTES, INITIAL_READ_BUFFER_BYTES, MAX_LINGER_BYTES,
};
pub use handler::Handler;
pub use request::RequestParts;
pub use response::{HeaderName, Response, ResponseBody, CONTENT_TYPE_JSON, CONTENT_TYPE_TEXT};
pub use server::{serve, ACCEPT_ERROR_BACKOFF, MAX_PENDING_REJECTIONS, REJECTION_TIMEOUT};
pub use shutdown::{ShutdownSignal, ShutdownTrigger, ShutdownWait};
