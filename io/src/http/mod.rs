//! HTTP/1.1 server of the request, receipt and admin APIs and the forward proxy, on the sans-IO
//! codec of `sortie_core::h1`.
//!
//! Each core runs [`serve`] on its own `SO_REUSEPORT` listener; every accepted connection is a
//! task running [`serve_connection`], which reads heads into one growable buffer, parses them
//! with `parse_request_head`, hands the owned [`RequestParts`] and a streaming [`Body`] to the
//! listener's [`Handler`], and writes the [`Response`] it returns. Requests on a connection are
//! answered strictly in order; pipelined bytes left after one request start the next.
//!
//! On the per-request path: no blocking, no locks, debug-level logging only.
//!
//! # Decisions
//!
//! - **Connection cap.** Past [`ServerConfig::max_connections`] per accept loop (per core), a
//!   new connection is accepted, answered `503` (the handler's
//!   [`Handler::error_response`] with reason `too_many_connections`) with `Connection: close`,
//!   and closed. At most [`MAX_PENDING_REJECTIONS`] rejections are in progress at once, each
//!   bounded by [`REJECTION_TIMEOUT`]; beyond that a new connection is closed without an
//!   answer, so that a flood cannot make the answers themselves a burden.
//! - **Errors the server answers itself.** Every `H1Error` of a head or body is answered with
//!   `H1Error::status()` (400/413/414/417/431/501/505), a timeout mid-head or mid-body with
//!   408, an unencodable handler response (1xx status, CR/LF in a value) with 500; each with
//!   `Connection: close`, then the connection closes. The body comes from
//!   [`Handler::error_response`] (default `{"error":"<reason>"}`, JSON, the reason being
//!   `H1Error::as_str()` or `request_timeout`), so each API can render its own envelope. A body
//!   read error overrides whatever the handler returned: framing is the server's business.
//! - **Admission and body limit.** [`Handler::admit`] decides per request from the head: it
//!   refuses, or picks the body limit and hands what it learned (an authenticated identity) to
//!   [`Handler::handle`]. A declared `Content-Length` above the limit is answered 413 before
//!   any body byte is read (and without `100 Continue`); a chunked body that grows past it
//!   fails the read with [`BodyError::TooLarge`] and the server answers 413.
//! - **`Expect: 100-continue`.** `HTTP/1.1 100 Continue` is sent when the handler first needs
//!   body bytes that have not arrived. It is omitted when body bytes already arrived with the
//!   head (RFC 9110 §10.1.1 allows that). If the handler answers without reading a body it
//!   never asked for, the connection is closed after the response: the client may or may not
//!   send the body, so the framing of what follows is unknown.
//! - **Unread body.** After the handler returns, up to [`ServerConfig::max_drain_bytes`]
//!   unread body bytes are read and discarded (within the body read timeout) to keep the
//!   connection; a declared length above the bound, or a chunked body that passes it, closes
//!   the connection instead. Draining happens before the response is written, so that a client
//!   still sending its body and a server writing a large response cannot block each other.
//! - **Lingering close.** After a response with `Connection: close` the server shuts down its
//!   sending side and discards input for up to [`ServerConfig::linger_timeout`] or
//!   [`MAX_LINGER_BYTES`], so that unread request bytes do not turn the close into a reset that
//!   destroys the response before the client reads it (RFC 9112 §9.6).
//! - **Timeouts.** `header_read_timeout` bounds a whole head from its first byte (slowloris),
//!   and also the wait for the first byte of a new connection (a connection that never sends
//!   is closed silently). `idle_timeout` bounds the wait between requests on a kept-alive
//!   connection (closed silently). `body_read_timeout` bounds each wait for body bytes (408).
//!   `write_timeout` bounds each write that makes no progress (a client that stopped reading is
//!   cut; a slow but steady one is not). A timeout mid-head answers 408; timeouts are never
//!   retried.
//! - **A client that leaves.** Once a handler has run for
//!   [`ServerConfig::departure_watch_after`] (10 ms), the server watches the connection (a
//!   duplicate of its descriptor, so the handler's reads are untouched). A close, a reset or a
//!   half-close, even behind unread pipelined bytes, drops the handler's future, which releases
//!   what it holds (an upstream exchange, worker capacity), and closes the connection without a
//!   response. Requests answered sooner pay one timer and no system call.
//! - **Graceful shutdown.** [`ShutdownTrigger::trigger`] (any thread) sets every core's
//!   [`ShutdownSignal`]. The accept loop then closes its listener; connections idle between
//!   requests close at once, without a response; a connection mid-request (head partly read,
//!   handler running, body being read) finishes that request and answers it with
//!   `Connection: close`; pipelined requests after it are not served (the client sees the close
//!   and may retry them). After [`ServerConfig::shutdown_grace`] the remaining connections are
//!   dropped and [`serve`] returns. A hand-over to a successor process
//!   ([`ShutdownTrigger::trigger_lingering`]) differs in one point: idle connections stay open
//!   for the linger, and each answers its next request with `Connection: close`, so that clients
//!   move over without meeting a close. A connection the kernel completed while the accept loop
//!   stopped is served, not dropped (the accept is cancelled and awaited, never abandoned).
//! - **Responses.** Always `HTTP/1.1`. The server writes `Content-Length` (none for 204 and 304;
//!   the body's length for HEAD, without the body), `Date` (formatted once per second per core,
//!   unless the handler set one), and `Connection` (`close` when closing, `keep-alive` for an
//!   HTTP/1.0 client that asked for it); the handler's own `Content-Length`,
//!   `Transfer-Encoding` and `Connection` fields are dropped. Bodies up to 16 KiB are sent in
//!   one write with the head.
//! - **Memory.** The read buffer starts at [`INITIAL_READ_BUFFER_BYTES`], doubles up to the head
//!   limit for a large head, grows to [`BODY_READ_BUFFER_BYTES`] while a body is read, and is
//!   replaced by a fresh initial-size buffer after any request that grew it. The state of
//!   reading heads and of the request in progress (handler future, body, response) is one box
//!   per busy period, each request's built where the one before ran, and a busy connection
//!   keeps the write buffer of its last response for the next. A connection quiet for 100 ms
//!   gives its buffers and that box back, its task ends, and it is parked (`park.rs`): a slot with its
//!   socket and limits, the socket in one epoll set per listener and core, the deadline in an
//!   ordered set. A client that sends again gets a new task. Measured with
//!   `perf/idle_rss.sh`, an idle keep-alive connection costs 0.5–1 KiB of RSS (8 KiB before
//!   decision 111, 2.3 KiB before decision 119).
//! - **Streamed bodies.** [`ResponseBody::Stream`] is written as its [`StreamBody`] produces
//!   it: `Content-Length` when the length is known, chunked otherwise (HTTP/1.0: until close,
//!   and the connection closes). The chunk-size line goes into room left in front of each
//!   piece, so framing copies nothing. The head goes out together with the first piece (one
//!   write instead of two); a stream whose first piece is slow therefore delays its head too.
//!   A stream that fails, or that yields more or fewer bytes than it declared, closes the
//!   connection: the status is already sent.
//! - **Tunnels.** A `2xx` response with [`ResponseBody::Tunnel`] is written without framing
//!   fields (RFC 9110 §9.3.6), whatever the request's HTTP version; then the connection's
//!   `TcpStream` and the bytes read past the head are handed to the [`Tunnel`], and the
//!   connection ends with it. Any other status turns the tunnel into an empty, closing
//!   response.

mod body;
mod config;
mod conn;
mod date;
mod departure;
mod handler;
mod park;
mod race;
pub(crate) use race::{race, Either};
#[cfg(test)]
pub(crate) use response::{encode_head, ConnectionField, RelayingBody};
mod request;
mod response;
mod server;
mod shutdown;

pub use body::{Body, BodyError};
pub use config::{
    CoreServerConfig, LiveServerConfig, ServerConfig, DEFAULT_BODY_READ_TIMEOUT,
    DEFAULT_DEPARTURE_WATCH_AFTER, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LINGER_TIMEOUT, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_DRAIN_BYTES, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WRITE_TIMEOUT,
};
pub use conn::{
    serve_connection, Parked, BODY_READ_BUFFER_BYTES, INITIAL_READ_BUFFER_BYTES, MAX_LINGER_BYTES,
};
pub use departure::RECHECK_WITH_UNREAD_BYTES;
pub use handler::{Admitted, Handler};
pub use request::RequestParts;
pub use response::{
    HeaderName, RelayedFields, Response, ResponseBody, StreamBody, Tunnel, CONTENT_TYPE_JSON,
    CONTENT_TYPE_TEXT, RESPONSE_HEAD_ROOM,
};
pub use server::{
    serve, serve_live, ACCEPT_ERROR_BACKOFF, MAX_PENDING_REJECTIONS, REJECTION_TIMEOUT,
};
pub use shutdown::{ShutdownSignal, ShutdownTrigger, ShutdownWait};
