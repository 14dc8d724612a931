//! Closed-loop load through CONNECT tunnels, for perf/proxy.sh: `CONNECTIONS` threads, each with
//! blocking sockets, for `SECONDS`, then one `WRK_RESULT`-style line (req/s and latency
//! percentiles in microseconds).
//!
//! Modes (first argument):
//! - `new-tunnel PROXY TARGET PATH`: per request, connect to the proxy, `CONNECT TARGET`, send
//!   `GET PATH` through the tunnel, read the response, close.
//! - `in-tunnel PROXY TARGET PATH`: one tunnel per thread, then keep-alive requests inside it.
//! - `direct-new TARGET PATH` / `direct-keepalive TARGET PATH`: the same requests straight to
//!   the target, the baselines of the two tunnel modes.
//!
//! Environment: `CONNECTIONS` (default 64), `SECONDS` (default 5), `PROXY_AUTH` (`user:pass`
//! for `Proxy-Authorization: Basic`, optional).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

struct Plan {
    mode: String,
    proxy: Option<String>,
    target: String,
    path: String,
    auth: Option<String>,
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reads one response (head, then a `Content-Length` body) from `s`, using `buf` for leftovers.
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, expect_body: bool) -> io::Result<u16> {
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head.get(9..12).and_then(|v| v.parse().ok()).unwrap_or(0);
            let len: usize = if expect_body {
                head.split("\r\n")
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            } else {
                0
            };
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk)?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            buf.drain(..end + 4 + len);
            return Ok(status);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn open_tunnel(p: &Plan) -> io::Result<(TcpStream, Vec<u8>)> {
    let proxy = p.proxy.as_deref().unwrap_or_default();
    let mut s = TcpStream::connect(proxy)?;
    s.set_nodelay(true)?;
    let mut req = format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n", t = p.target);
    if let Some(a) = &p.auth {
        req.push_str(&format!("Proxy-Authorization: Basic {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    let status = read_response(&mut s, &mut buf, false)?;
    if status != 200 {
        return Err(io::Error::other(format!("CONNECT answered {status}")));
    }
    Ok((s, buf))
}

fn get(s: &mut TcpStream, buf: &mut Vec<u8>, p: &Plan) -> io::Result<()> {
    let req = format!("GET {} HTTP/1.1\r\nHost: {}\r\n\r\n", p.path, p.target);
    s.write_all(req.as_bytes())?;
    match read_response(s, buf, true)? {
        200 => Ok(()),
        other => Err(io::Error::other(format!("status {other}"))),
    }
}

fn worker(p: Arc<Plan>, stop: Arc<AtomicBool>) -> (Vec<u32>, u64) {
    let mut lat = Vec::with_capacity(1 << 16);
    let mut errors = 0u64;
    let mut held: Option<(TcpStream, Vec<u8>)> = None;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let r = match p.mode.as_str() {
            "new-tunnel" => open_tunnel(&p).and_then(|(mut s, mut b)| get(&mut s, &mut b, &p)),
            "direct-new" => TcpStream::connect(&p.target).and_then(|mut s| {
                s.set_nodelay(true)?;
                get(&mut s, &mut Vec::new(), &p)
            }),
            _ => {
                if held.is_none() {
                    held = Some(if p.mode == "in-tunnel" {
                        open_tunnel(&p)
                    } else {
                        TcpStream::connect(&p.target).and_then(|s| {
                            s.set_nodelay(true)?;
                            Ok((s, Vec::new()))
                        })
                    }
                    .unwrap_or_else(|e| panic!("opening the connection: {e}")));
                    continue;
                }
                let (s, b) = held.as_mut().expect("held");
                get(s, b, &p)
            }
        };
        match r {
            Ok(()) => lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX)),
            Err(_) => {
                errors += 1;
                held = None;
            }
        }
    }
    (lat, errors)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: tunnelbench new-tunnel|in-tunnel PROXY TARGET PATH | direct-new|direct-keepalive TARGET PATH";
    let plan = match args.first().map(String::as_str) {
        Some("new-tunnel" | "in-tunnel") if args.len() == 4 => Plan {
            mode: args[0].clone(),
            proxy: Some(args[1].clone()),
            target: args[2].clone(),
            path: args[3].clone(),
            auth: std::env::var("PROXY_AUTH")
                .ok()
                .map(|a| base64::engine::general_purpose::STANDARD.encode(a)),
        },
        Some("direct-new" | "direct-keepalive") if args.len() == 3 => Plan {
            mode: args[0].clone(),
            proxy: None,
            target: args[1].clone(),
            path: args[2].clone(),
            auth: None,
        },
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let conns = env_num("CONNECTIONS", 64);
    let secs = env_num("SECONDS", 5);
    let plan = Arc::new(plan);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|_| {
            let (p, s) = (plan.clone(), stop.clone());
            std::thread::spawn(move || worker(p, s))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.join().expect("worker");
        all.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |q: f64| -> u32 {
        if all.is_empty() {
            return 0;
        }
        let i = ((all.len() as f64 * q) as usize).min(all.len() - 1);
        all[i]
    };
    println!(
        "WRK_RESULT requests={} seconds={seconds:.3} rps={:.1} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} connect_errors=0 read_errors={errors} write_errors=0 timeouts=0 non_2xx=0",
        all.len(),
        all.len() as f64 / seconds,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.999),
        all.last().copied().unwrap_or(0),
    );
}
