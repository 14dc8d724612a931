//! The `monoio-decisions` variant: the `monoio-http` relay with the gateway's per-request
//! decisions made between its four operations as plain calls into `sortie-core`, in one task
//! per client connection: the request path written as one state machine per connection, with
//! none of the gateway's machinery between the decisions (no handler, dispatch or exchange
//! futures, no stage limits, no pool, no hand-over of the body).
//!
//! Per request, as the gateway's forward proxy decides it:
//! - the request head parsed by the core's HTTP/1.1 codec (bare LF, framing, `Host`, limits);
//! - the proxy credentials: `Proxy-Authorization` decoded as Basic, the password compared in
//!   constant time with the deployment token (`PROXY_TOKEN`; a request without them is refused);
//! - the method, the absolute-form target parsed by the strict URL parser, the refused ports,
//!   the routing hints, the `Connection` tokens and the forwarded fields;
//! - routing: the rule table of `perf/proxy.sh`'s snapshot and one local worker, routed per
//!   request (`RoutingTable::route`);
//! - the destination policy on the upstream's address (`127.0.0.0/8` allowed);
//! - a request id (from a counter: the gateway's comes from a batch of random bytes);
//! - the upstream request head written by the core's writer (origin form, `Host`, the fields);
//! - the response head parsed into offsets with its framing rules, each field classified by
//!   name for relaying, and the client's head written by the core's response writer.
//!
//! On io_uring a small upstream request, and a small answer, are sent on the socket's second
//! descriptor before the read that follows them and collected after it, as the gateway sends.
//!
//! What it leaves out of the gateway's work: the timers, metrics, the active-request table,
//! access logging and error answers (a refused request closes the connection here).
//! So its CPU per request is what the gateway's request path could cost at least with its
//! decisions as they are: a floor, measured.
//!
//! `monoio-api` ([`api_relay`]) is the same for the request API: the bearer token, the envelope
//! decoded and validated, the route, the exchange, the result envelope.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use monoio::buf::{IoBuf, VecBuf};
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use sortie_core::destination::{Cidr, DestinationPolicy};
use sortie_core::fingerprint::BUILTIN_PROFILES;
use sortie_core::h1::{
    parse_request_head, parse_response_head_offsets, write_request_head, BodyFraming, FieldOffsets,
    HeadLimits, OutgoingBody, Parsed, ResponseFraming, ResponseHeadWriter,
};
use sortie_core::proxy::{
    connection_tokens_of, is_forwarded_request_field, parse_basic, response_field_name,
    route_hints, ResponseFieldName,
};
use sortie_core::request::{decode_request, parse_target_url, Method, ValidationContext};
use sortie_core::result::{RequestResult, ResultBody, Timing};
use sortie_core::routing::{Ingress, RouteRequest, RoutingTable, StickyPins};
use sortie_core::snapshot::{decode_snapshot, ConfigId};
use sortie_core::worker::{AdvertisedCapabilities, Executor, WorkerRecord};

/// `perf/proxy.sh`'s snapshot, as the gateway under test loads it.
const SNAPSHOT: &str = r#"{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}"#;

/// Room before a response for the client's head, beyond the upstream head's own.
const HEADROOM: usize = 512;

/// Ports the gateway refuses by default (a sample of the same size of check).
const DENIED_PORTS: &[u16] = &[25, 465, 587];

/// What every connection shares: the rule table, the policy and the token.
pub(crate) struct Decisions {
    table: RoutingTable,
    policy: DestinationPolicy,
    token: Vec<u8>,
}

impl Decisions {
    pub(crate) fn new() -> Arc<Decisions> {
        let mut doc = SNAPSHOT.as_bytes().to_vec();
        let snapshot = decode_snapshot(&mut doc).expect("the lab's snapshot is valid");
        let caps = AdvertisedCapabilities {
            capacity: 100_000,
            ..Default::default()
        }
        .validate()
        .expect("the lab worker's capabilities are valid");
        let worker = WorkerRecord::connected(
            ConfigId::parse("local").expect("a valid worker id"),
            "session",
            Executor::Local,
            caps,
        );
        let table = RoutingTable::build(Arc::new(snapshot), [&worker]);
        let allow: Cidr = "127.0.0.0/8".parse().expect("a valid prefix");
        let token = std::env::var("PROXY_TOKEN")
            .unwrap_or_default()
            .into_bytes();
        Arc::new(Decisions {
            table,
            policy: DestinationPolicy::new(vec![allow], Vec::new()),
            token,
        })
    }
}

/// Constant-time equality of two byte strings of equal length (the length is not secret).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The decisions on one request head at the start of `req`: `Some(length of the head)` with
/// the upstream head written into `out` and the method kept in `method`, `None` while the head
/// is incomplete; `Err` for a request the gateway would refuse. `req` is only read; it is
/// lent mutably as to [`decide_api_request`], which decodes the envelope in place, so that one
/// read loop ([`Client::read_next`]) serves both.
fn decide_request(
    d: &Decisions,
    req: &mut [u8],
    out: &mut Vec<u8>,
    upstream_ip: IpAddr,
    pins: &mut StickyPins,
    counter: &mut u64,
    method: &mut Method,
) -> io::Result<Option<usize>> {
    let refused = |what: &str| io::Error::other(what.to_owned());
    let (head, consumed_len) = match parse_request_head(req, &HeadLimits::REQUEST) {
        Ok(Parsed::Complete { head, consumed_len }) => (head, consumed_len),
        Ok(Parsed::Partial) => return Ok(None),
        Err(_) => return Err(refused("bad request head")),
    };
    let fields = || head.headers().iter().map(|h| (h.name(), h.value()));
    // The proxy credentials.
    let credentials = fields()
        .find(|(n, _)| n.eq_ignore_ascii_case("proxy-authorization"))
        .and_then(|(_, v)| parse_basic(v))
        .ok_or_else(|| refused("no proxy credentials"))?;
    if !same_secret(credentials.password(), &d.token) {
        return Err(refused("wrong proxy credentials"));
    }
    *method = Method::parse(head.method()).ok_or_else(|| refused("method"))?;
    let url = parse_target_url(head.target()).map_err(|_| refused("target"))?;
    if DENIED_PORTS.contains(&url.port) {
        return Err(refused("port"));
    }
    let hints = route_hints(fields()).map_err(|_| refused("hints"))?;
    let tokens = connection_tokens_of(fields().map(|(n, v)| (n.as_bytes(), v)));
    let mut forwarded: Vec<(&str, &[u8])> = Vec::with_capacity(head.headers().len());
    forwarded.extend(fields().filter(|(n, _)| is_forwarded_request_field(n, &tokens)));
    *counter += 1;
    let route = RouteRequest {
        deployment_id: "perf",
        hints: &hints,
        ingress: Ingress::Proxy,
        host: &url.host,
        tie_break: *counter,
    };
    d.table
        .route(&route, pins, 0, &|_| 0u32)
        .map_err(|_| refused("no route"))?;
    d.policy
        .check(upstream_ip)
        .map_err(|_| refused("destination"))?;
    // The request id, as the gateway writes one per request.
    let id = sortie_core::ids::request_id((*counter as u128).to_le_bytes());
    std::hint::black_box(&id);
    write_request_head(
        out,
        head.method(),
        &url.path_and_query,
        url.authority().as_bytes(),
        forwarded,
        OutgoingBody::None,
    )
    .map_err(|_| refused("request head"))?;
    Ok(Some(consumed_len))
}

/// The decisions on a complete response head at the start of `resp`: the client's head written
/// into `out`; returns the head's length and the body's.
fn decide_response(
    resp: &[u8],
    method: Method,
    fields: &mut Vec<FieldOffsets>,
    out: &mut Vec<u8>,
) -> io::Result<Option<(usize, usize)>> {
    let method = if method == Method::Head {
        "HEAD"
    } else {
        "GET"
    };
    let (start, head_len) =
        match parse_response_head_offsets(resp, method, &HeadLimits::RESPONSE, fields) {
            Ok(Parsed::Complete { head, consumed_len }) => (head, consumed_len),
            Ok(Parsed::Partial) => return Ok(None),
            Err(_) => return Err(io::Error::other("bad response head")),
        };
    let body_len = match start.framing() {
        ResponseFraming::ContentLength(n) => n as usize,
        ResponseFraming::None => 0,
        _ => return Err(io::Error::other("the lab relays length-framed bodies only")),
    };
    let mut head =
        ResponseHeadWriter::start(out, start.status()).map_err(|_| io::Error::other("status"))?;
    for f in fields.iter() {
        let (name, value) = f.read(resp);
        match response_field_name(name) {
            ResponseFieldName::Ordinary | ResponseFieldName::Date => head
                .field(name, value)
                .map_err(|_| io::Error::other("field"))?,
            _ => {}
        }
    }
    head.end(OutgoingBody::ContentLength(body_len as u64));
    Ok(Some((head_len, body_len)))
}

/// A second descriptor of `stream`'s socket, for a send made while a read of it waits.
fn second(stream: &TcpStream) -> io::Result<TcpStream> {
    // SAFETY: `stream` owns the descriptor and is borrowed for the whole call; the duplicate
    // owns its own.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    TcpStream::from_std(std::net::TcpStream::from(fd.try_clone_to_owned()?))
}

/// Most bytes sent ahead of a read, as the gateway's limit (a send the socket takes whole).
const MAX_SENT_AHEAD_BYTES: usize = 8 * 1024;

/// A client connection's side of a relay: its socket, the bytes it sent, and the decisions'
/// state across its requests.
struct Client {
    d: Arc<Decisions>,
    stream: TcpStream,
    req: Vec<u8>,
    /// The upstream head the last decided request is sent as.
    up_out: Vec<u8>,
    upstream_ip: IpAddr,
    pins: StickyPins,
    counter: u64,
    method: Method,
    read_bytes: usize,
}

impl Client {
    /// Reads until a request is complete and decided by `decide` ([`decide_request`] or
    /// [`decide_api_request`]): `Some(its length)` with the upstream head in `up_out`, `None` when
    /// the client closed.
    async fn read_next(
        &mut self,
        decide: impl Fn(
            &Decisions,
            &mut [u8],
            &mut Vec<u8>,
            IpAddr,
            &mut StickyPins,
            &mut u64,
            &mut Method,
        ) -> io::Result<Option<usize>>,
    ) -> io::Result<Option<usize>> {
        self.up_out.clear();
        loop {
            if let Some(len) = decide(
                &self.d,
                &mut self.req,
                &mut self.up_out,
                self.upstream_ip,
                &mut self.pins,
                &mut self.counter,
                &mut self.method,
            )? {
                return Ok(Some(len));
            }
            if crate::on_monoio::read_more(&mut self.stream, &mut self.req, self.read_bytes).await?
                == 0
            {
                return Ok(None);
            }
        }
    }
}

/// A relay's upstream connection: one per client connection, with a second descriptor for the
/// request sent while its answer is read.
struct Upstream {
    stream: TcpStream,
    second: TcpStream,
    resp: Vec<u8>,
    fields: Vec<FieldOffsets>,
    read_bytes: usize,
}

impl Upstream {
    /// Sends `request` and reads the answer into `resp` from `at` on, until `head` finds its head
    /// complete (`Some((head length, body length))`, given the bytes from `at` and the fields'
    /// offsets to fill) and its body is whole. On io_uring (`ahead`) the request goes on the
    /// second descriptor and is collected after the head is read; otherwise it is sent first.
    /// `None` when the upstream closed.
    async fn exchange(
        &mut self,
        request: &mut Vec<u8>,
        ahead: bool,
        at: usize,
        mut head: impl FnMut(&[u8], &mut Vec<FieldOffsets>) -> io::Result<Option<(usize, usize)>>,
    ) -> io::Result<Option<(usize, usize)>> {
        let request_len = request.len();
        let mut sending = std::pin::pin!(self.second.write(std::mem::take(request)));
        if !ahead {
            let (res, back) = sending.as_mut().await;
            *request = back;
            if res? != request_len {
                return Err(io::Error::other("short send of a request head"));
            }
        }
        let (head_len, body_len) = loop {
            if let Some(lens) = head(self.resp.get(at..).unwrap_or_default(), &mut self.fields)? {
                break lens;
            }
            if crate::on_monoio::read_more(&mut self.stream, &mut self.resp, self.read_bytes)
                .await?
                == 0
            {
                return Ok(None);
            }
        };
        if ahead {
            let (res, back) = sending.as_mut().await;
            *request = back;
            if res? != request_len {
                return Err(io::Error::other("short send of a request head"));
            }
        }
        let end = at + head_len + body_len;
        while self.resp.len() < end {
            if crate::on_monoio::read_more(&mut self.stream, &mut self.resp, self.read_bytes)
                .await?
                == 0
            {
                return Ok(None);
            }
        }
        Ok(Some((head_len, body_len)))
    }
}

/// A client connection accepted by a relay, its upstream connection opened, and a second
/// descriptor of the client's socket for answers sent while the next request is read. Whether
/// sends go ahead of reads: on io_uring only (the epoll driver makes a send when it is polled,
/// so there it is sent first).
async fn open(
    d: Arc<Decisions>,
    client: TcpStream,
    upstream: SocketAddr,
    read_bytes: usize,
) -> io::Result<(Client, TcpStream, Upstream, bool)> {
    client.set_nodelay(true)?;
    let up = TcpStream::connect(upstream).await?;
    up.set_nodelay(true)?;
    let client2 = second(&client)?;
    let up = Upstream {
        second: second(&up)?,
        stream: up,
        resp: Vec::with_capacity(read_bytes),
        fields: Vec::with_capacity(32),
        read_bytes,
    };
    let client = Client {
        d,
        stream: client,
        req: Vec::with_capacity(read_bytes),
        up_out: Vec::with_capacity(4096),
        upstream_ip: upstream.ip(),
        pins: StickyPins::new(1),
        counter: 0,
        method: Method::Get,
        read_bytes,
    };
    Ok((client, client2, up, !monoio::utils::is_legacy()))
}

/// One client connection: its own upstream connection, requests relayed one at a time with
/// the decisions above between the operations. On io_uring a small send goes on the socket's
/// second descriptor before the read that follows it and is collected after that read, as the
/// gateway sends (its decisions 124 and 125): the upstream request while its answer is read,
/// the answer while the next request is read.
pub(crate) async fn relay(
    d: Arc<Decisions>,
    client: TcpStream,
    upstream: SocketAddr,
    read_bytes: usize,
) -> io::Result<()> {
    let (mut client, mut client2, mut up, ahead) = open(d, client, upstream, read_bytes).await?;
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut next = client.read_next(decide_request).await?;
    while let Some(len) = next {
        client.req.drain(..len);
        // The response is read after room for the client's head, which is written there in
        // front of the body once decided: one send of head and body, no copy of the body.
        up.resp.clear();
        up.resp.resize(HEADROOM, 0);
        out.clear();
        let method = client.method;
        let answered = up
            .exchange(&mut client.up_out, ahead, HEADROOM, |received, fields| {
                decide_response(received, method, fields, &mut out)
            })
            .await?;
        let Some((head_len, body_len)) = answered else {
            return Ok(());
        };
        let body_at = HEADROOM + head_len;
        let end = body_at + body_len;
        let Some(start) = body_at.checked_sub(out.len()) else {
            return Err(io::Error::other(
                "the client's head outgrew the room before the body",
            ));
        };
        let mut resp = std::mem::take(&mut up.resp);
        resp[start..body_at].copy_from_slice(&out);
        if ahead && end - start <= MAX_SENT_AHEAD_BYTES {
            let mut answer = std::pin::pin!(client2.write(resp.slice(start..end)));
            next = client.read_next(decide_request).await?;
            let (res, back) = answer.as_mut().await;
            resp = back.into_inner();
            let sent = res?;
            if sent < end - start {
                let (res, back) = client.stream.write_all(resp.slice(start + sent..end)).await;
                resp = back.into_inner();
                res?;
            }
        } else {
            let (res, back) = client.stream.write_all(resp.slice(start..end)).await;
            resp = back.into_inner();
            res?;
            next = client.read_next(decide_request).await?;
        }
        up.resp = resp;
    }
    Ok(())
}

/// The request API's limits the gateway validates an envelope against (its defaults).
const MAX_INLINE_REQUEST_BODY_BYTES: usize = 1024 * 1024;
const MAX_TIMEOUT_MS: u64 = 300_000;

/// The decisions on one request API call at the start of `req`, its envelope included:
/// `Some(length of head and envelope)` with the upstream head written into `out`, `None` while
/// the call is incomplete; `Err` for a call the gateway would refuse.
fn decide_api_request(
    d: &Decisions,
    req: &mut [u8],
    out: &mut Vec<u8>,
    upstream_ip: IpAddr,
    pins: &mut StickyPins,
    counter: &mut u64,
    method: &mut Method,
) -> io::Result<Option<usize>> {
    let refused = |what: &str| io::Error::other(what.to_owned());
    let (head_len, body_len) = {
        let (head, head_len) = match parse_request_head(req, &HeadLimits::REQUEST) {
            Ok(Parsed::Complete { head, consumed_len }) => (head, consumed_len),
            Ok(Parsed::Partial) => return Ok(None),
            Err(_) => return Err(refused("bad request head")),
        };
        if head.method() != "POST" || head.target() != "/api/v1/requests" {
            return Err(refused("not a request API call"));
        }
        let field = |name: &str| {
            head.headers()
                .iter()
                .find(|h| h.name().eq_ignore_ascii_case(name))
                .map(|h| h.value())
        };
        // The bearer token.
        let token = field("authorization")
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .ok_or_else(|| refused("no bearer token"))?;
        if !same_secret(token, &d.token) {
            return Err(refused("wrong token"));
        }
        if !field("content-type")
            .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"application/json"))
        {
            return Err(refused("content type"));
        }
        let body_len = match head.framing() {
            BodyFraming::ContentLength(n) => n as usize,
            _ => return Err(refused("the lab reads length-framed envelopes only")),
        };
        (head_len, body_len)
    };
    let end = head_len + body_len;
    let Some(envelope) = req.get_mut(head_len..end) else {
        return Ok(None);
    };
    // Decoded in place, as the gateway decodes the body it read.
    let vctx = ValidationContext {
        max_inline_request_body_bytes: MAX_INLINE_REQUEST_BODY_BYTES,
        max_timeout_ms: MAX_TIMEOUT_MS,
        default_timeout_ms: 60_000,
        is_object_storage_enabled: false,
        fingerprint_profiles: BUILTIN_PROFILES,
    };
    let r = decode_request(envelope, &vctx).map_err(|_| refused("envelope"))?;
    if DENIED_PORTS.contains(&r.url.port) {
        return Err(refused("port"));
    }
    *method = r.method;
    *counter += 1;
    let route = RouteRequest {
        deployment_id: "perf",
        hints: &r.routing,
        ingress: Ingress::Api,
        host: &r.url.host,
        tie_break: *counter,
    };
    d.table
        .route(&route, pins, 0, &|_| 0u32)
        .map_err(|_| refused("no route"))?;
    d.policy
        .check(upstream_ip)
        .map_err(|_| refused("destination"))?;
    write_request_head(
        out,
        r.method.as_str(),
        &r.url.path_and_query,
        r.url.authority().as_bytes(),
        r.headers.iter().map(|h| (h.name().as_bytes(), h.value())),
        OutgoingBody::None,
    )
    .map_err(|_| refused("request head"))?;
    Ok(Some(end))
}

/// The result envelope of a complete response at the start of `resp` (its head's fields in
/// `fields`), returned; the client's head for it written into `out`.
fn answer_api(
    resp: &[u8],
    fields: &[FieldOffsets],
    status: u16,
    body: &[u8],
    request_id: &str,
    timing: Timing,
    out: &mut Vec<u8>,
) -> io::Result<Vec<u8>> {
    let mut headers: Vec<(&[u8], &[u8])> = Vec::with_capacity(fields.len());
    for f in fields {
        let (name, value) = f.read(resp);
        match response_field_name(name) {
            ResponseFieldName::Connection | ResponseFieldName::HopByHop => {}
            _ => headers.push((name, value)),
        }
    }
    let json = RequestResult {
        request_id,
        status,
        headers: &headers,
        header_names_are_tokens: true,
        body: ResultBody::Inline(body),
        timing,
    }
    .to_json();
    let mut head = ResponseHeadWriter::start(out, 200).map_err(|_| io::Error::other("status"))?;
    head.field(b"content-type", b"application/json")
        .map_err(|_| io::Error::other("field"))?;
    head.end(OutgoingBody::ContentLength(json.len() as u64));
    Ok(json)
}

/// One request API client connection: its own upstream connection, calls answered one at a
/// time with the request API's decisions between the operations, small sends made ahead of
/// the read that follows them as in [`relay`].
pub(crate) async fn api_relay(
    d: Arc<Decisions>,
    client: TcpStream,
    upstream: SocketAddr,
    read_bytes: usize,
) -> io::Result<()> {
    let (mut client, mut client2, mut up, ahead) = open(d, client, upstream, read_bytes).await?;
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut next = client.read_next(decide_api_request).await?;
    while let Some(len) = next {
        let started = Instant::now();
        let request_id = sortie_core::ids::request_id((client.counter as u128).to_le_bytes());
        client.req.drain(..len);
        up.resp.clear();
        let method_name = if client.method == Method::Head {
            "HEAD"
        } else {
            "GET"
        };
        let mut status = 0;
        let answered = up
            .exchange(&mut client.up_out, ahead, 0, |received, fields| {
                match parse_response_head_offsets(
                    received,
                    method_name,
                    &HeadLimits::RESPONSE,
                    fields,
                ) {
                    Ok(Parsed::Complete { head, consumed_len }) => {
                        let body_len = match head.framing() {
                            ResponseFraming::ContentLength(n) => n as usize,
                            ResponseFraming::None => 0,
                            _ => return Err(io::Error::other("length-framed bodies only")),
                        };
                        status = head.status();
                        Ok(Some((consumed_len, body_len)))
                    }
                    Ok(Parsed::Partial) => Ok(None),
                    Err(_) => Err(io::Error::other("bad response head")),
                }
            })
            .await?;
        let Some((head_len, body_len)) = answered else {
            return Ok(());
        };
        let end = head_len + body_len;
        let done = Instant::now();
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let timing = Timing {
            routing_ms: 0,
            assignment_ms: 0,
            egress_ms: ms(done - started),
            total_ms: ms(done - started),
        };
        out.clear();
        let json = answer_api(
            &up.resp,
            &up.fields,
            status,
            &up.resp[head_len..end],
            request_id.as_str(),
            timing,
            &mut out,
        )?;
        let total = out.len() + json.len();
        // Head and envelope in one vectored send: the envelope is not copied behind the head.
        let answer = VecBuf::from(vec![std::mem::take(&mut out), json]);
        if ahead && total <= MAX_SENT_AHEAD_BYTES {
            let mut sending = std::pin::pin!(client2.writev(answer));
            next = client.read_next(decide_api_request).await?;
            let (res, back) = sending.as_mut().await;
            out = first_of(back);
            if res? != total {
                return Err(io::Error::other("short send of an answer"));
            }
        } else {
            let (res, back) = client.stream.write_vectored_all(answer).await;
            out = first_of(back);
            res?;
            next = client.read_next(decide_api_request).await?;
        }
    }
    Ok(())
}

/// The first buffer of a vectored send, to be used again.
fn first_of(sent: VecBuf) -> Vec<u8> {
    let mut bufs: Vec<Vec<u8>> = sent.into();
    bufs.truncate(1);
    bufs.pop().unwrap_or_default()
}
