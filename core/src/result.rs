//! Encoding of the request result envelope (spec, Request result): status, ordered headers with
//! duplicates, the body inline (base64) or as a receipt, and timing.
//!
//! This is on the per-request path: the envelope is written straight into one buffer, base64
//! included, without intermediate strings.

use crate::json::write_str;

/// Stage timings of a request, in whole milliseconds, each rounded down on its own (decision
/// 128).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// From admission (the envelope decoded and checked) to the choice of the worker that
    /// answered, attempts refused before it included.
    pub routing_ms: u64,
    /// From that choice until the worker took the request over and started the upstream
    /// request: a remote worker's `Accept` reaching the control; 0 on a local worker.
    pub assignment_ms: u64,
    /// From the hand-over to the whole answer (for a remote worker, the bus hop included).
    pub egress_ms: u64,
    /// The whole request as the gateway saw it.
    pub total_ms: u64,
}

/// The response body as returned in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultBody<'a> {
    /// Inline bytes; `truncated` is always false on the wire.
    Inline(&'a [u8]),
    /// Inline bytes in two pieces, encoded as one: the body is the first followed by the
    /// second (a body whose start was read with the response head and kept where it was).
    InlineParts(&'a [u8], &'a [u8]),
    /// A verified response receipt.
    Receipt {
        /// The receipt id.
        receipt_id: &'a str,
        /// Size of the stored body.
        size_bytes: u64,
        /// Lowercase hex SHA-256 of the stored body.
        sha256_hex: &'a str,
    },
}

/// Everything the result envelope carries.
#[derive(Debug, Clone, Copy)]
pub struct RequestResult<'a> {
    /// The request id (`req_…`).
    pub request_id: &'a str,
    /// The destination's status.
    pub status: u16,
    /// Response headers in order, duplicates preserved: raw name and value bytes.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// Every name in `headers` is a token, as an HTTP/1.1 parser that accepts nothing else
    /// read them: they are copied without a look at each byte. False: each is checked and,
    /// when it is not a token, escaped.
    pub header_names_are_tokens: bool,
    /// The body.
    pub body: ResultBody<'a>,
    /// Timing.
    pub timing: Timing,
}

/// Appends `data` as a quoted base64 string. SIMD encoding straight into the spare capacity
/// of `out` (AVX-512 VBMI where the CPU has it, `sortie-b64`): no zero-filled room to encode
/// into, no second buffer (`core/benches/base64.rs` measures the encoders).
fn write_b64(out: &mut Vec<u8>, data: &[u8]) {
    out.push(b'"');
    sortie_b64::encode_append(data, out);
    out.push(b'"');
}

/// [`write_b64`] of `first` followed by `second`, without joining them: the whole groups of
/// three bytes of `first`, then the group that straddles the two, then the rest of `second`.
fn write_b64_parts(out: &mut Vec<u8>, first: &[u8], second: &[u8]) {
    out.push(b'"');
    let whole = first.len() - first.len() % 3;
    let (aligned, carry) = first.split_at(whole);
    sortie_b64::encode_append(aligned, out);
    let take = (3 - carry.len()).min(second.len());
    let (head, rest) = second.split_at(if carry.is_empty() { 0 } else { take });
    // At most three bytes: a carry of one or two and the head that completes it.
    let mut joint = [0u8; 3];
    let joint_len = carry.len() + head.len();
    if let Some(dst) = joint.get_mut(..carry.len()) {
        dst.copy_from_slice(carry);
    }
    if let Some(dst) = joint.get_mut(carry.len()..joint_len) {
        dst.copy_from_slice(head);
    }
    // Padded only when `second` ran out, which is then the end of the data.
    sortie_b64::encode_append(joint.get(..joint_len).unwrap_or_default(), out);
    sortie_b64::encode_append(rest, out);
    out.push(b'"');
}

/// A number in decimal. The stage timings are mostly a single digit (0 ms on a quick answer):
/// pushed as one byte.
fn write_u64(out: &mut Vec<u8>, v: u64) {
    match u8::try_from(v) {
        Ok(d @ 0..=9) => out.push(b'0' + d),
        _ => out.extend_from_slice(crate::decimal::Digits::of(v).as_bytes()),
    }
}

/// A token as a JSON string: nothing in it needs escaping.
fn write_token(out: &mut Vec<u8>, token: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(token);
    out.push(b'"');
}

/// Header names are tokens on the wire, copied as they are (a token is ASCII with nothing JSON
/// escapes); anything else is shown as lossy UTF-8.
fn write_name(out: &mut Vec<u8>, name: &[u8]) {
    if name.iter().all(|&b| crate::request::is_tchar(b)) {
        write_token(out, name);
        return;
    }
    match std::str::from_utf8(name) {
        Ok(s) => write_str(out, s),
        Err(_) => write_str(out, &String::from_utf8_lossy(name)),
    }
}

impl RequestResult<'_> {
    /// Room for the whole document, so that [`RequestResult::to_json`] writes it without a
    /// reallocation (which would copy it, body and all): base64 of `n` bytes is
    /// `4 * ceil(n / 3)` characters; the fixed text around the fields, with the largest
    /// numbers, is under `FIXED_BYTES`. Only a request id or header name that needs escaping
    /// can make the document longer.
    fn json_len_bound(&self) -> usize {
        const FIXED_BYTES: usize = 288;
        let b64 = |n: usize| n.div_ceil(3) * 4;
        let body_len = match self.body {
            ResultBody::Inline(b) => b64(b.len()),
            ResultBody::InlineParts(a, b) => b64(a.len() + b.len()),
            ResultBody::Receipt {
                receipt_id,
                sha256_hex,
                ..
            } => receipt_id.len() + sha256_hex.len() + 96,
        };
        let head_len: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + b64(v.len()) + 32)
            .sum();
        FIXED_BYTES + self.request_id.len() + body_len + head_len
    }

    /// Encodes the envelope as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_json_behind(0)
    }

    /// [`RequestResult::to_json`] written behind `room` zero bytes, left for what goes before
    /// the document in the same buffer (an HTTP head), so that the document is not copied
    /// behind it.
    pub fn to_json_behind(&self, room: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(room + self.json_len_bound());
        out.resize(room, 0);
        out.extend_from_slice(b"{\"request_id\":");
        write_str(&mut out, self.request_id);
        out.extend_from_slice(b",\"status\":");
        write_u64(&mut out, u64::from(self.status));
        out.extend_from_slice(b",\"headers\":[");
        // The punctuation between a field's parts is written as one piece each, with the quotes
        // around a token name and around the base64: three appends of constants per field.
        for (i, (n, v)) in self.headers.iter().enumerate() {
            if self.header_names_are_tokens {
                out.extend_from_slice(if i > 0 {
                    b",{\"name\":\""
                } else {
                    b"{\"name\":\""
                });
                out.extend_from_slice(n);
                out.extend_from_slice(b"\",\"value_base64\":\"");
            } else {
                out.extend_from_slice(if i > 0 { b",{\"name\":" } else { b"{\"name\":" });
                write_name(&mut out, n);
                out.extend_from_slice(b",\"value_base64\":\"");
            }
            sortie_b64::encode_append(v, &mut out);
            out.extend_from_slice(b"\"}");
        }
        out.extend_from_slice(b"],\"body\":");
        match self.body {
            ResultBody::Inline(b) => {
                out.extend_from_slice(b"{\"mode\":\"inline_base64\",\"data_base64\":");
                write_b64(&mut out, b);
                out.extend_from_slice(b",\"truncated\":false}");
            }
            ResultBody::InlineParts(a, b) => {
                out.extend_from_slice(b"{\"mode\":\"inline_base64\",\"data_base64\":");
                write_b64_parts(&mut out, a, b);
                out.extend_from_slice(b",\"truncated\":false}");
            }
            ResultBody::Receipt {
                receipt_id,
                size_bytes,
                sha256_hex,
            } => {
                out.extend_from_slice(b"{\"mode\":\"receipt\",\"receipt_id\":");
                write_str(&mut out, receipt_id);
                out.extend_from_slice(b",\"size_bytes\":");
                write_u64(&mut out, size_bytes);
                out.extend_from_slice(b",\"sha256_hex\":");
                write_str(&mut out, sha256_hex);
                out.push(b'}');
            }
        }
        let t = self.timing;
        out.extend_from_slice(b",\"timing\":{\"routing_ms\":");
        write_u64(&mut out, t.routing_ms);
        out.extend_from_slice(b",\"assignment_ms\":");
        write_u64(&mut out, t.assignment_ms);
        out.extend_from_slice(b",\"egress_ms\":");
        write_u64(&mut out, t.egress_ms);
        out.extend_from_slice(b",\"total_ms\":");
        write_u64(&mut out, t.total_ms);
        out.extend_from_slice(b"}}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document is written into the room sized for it: no reallocation, whatever the
    /// lengths of the fields and the body (a realloc would copy the whole envelope).
    #[test]
    fn the_document_fits_the_room_sized_for_it() {
        let long_id = "req_".to_owned() + &"f".repeat(60);
        for id in ["req_1", long_id.as_str()] {
            for n in 0..7 {
                let value = vec![b'v'; n * 5];
                let headers: Vec<(&[u8], &[u8])> = (0..n)
                    .map(|_| (&b"X-Header-Name"[..], &value[..]))
                    .collect();
                for len in [0, 1, 2, 3, 1000, 1024, 1025] {
                    let body = vec![0xa5; len];
                    let (a, b) = body.split_at(len / 3);
                    let receipt = ResultBody::Receipt {
                        receipt_id: "rcpt_0123456789abcdef0123456789abcdef",
                        size_bytes: u64::MAX,
                        sha256_hex: &"0".repeat(64),
                    };
                    let bodies = [
                        ResultBody::Inline(&body),
                        ResultBody::InlineParts(a, b),
                        receipt,
                    ];
                    for body in bodies {
                        let r = RequestResult {
                            request_id: id,
                            status: 200,
                            headers: &headers,
                            header_names_are_tokens: true,
                            body,
                            timing: Timing {
                                routing_ms: u64::MAX,
                                assignment_ms: u64::MAX,
                                egress_ms: u64::MAX,
                                total_ms: u64::MAX,
                            },
                        };
                        let json = r.to_json();
                        assert!(json.len() <= r.json_len_bound(), "{n} fields, {len} bytes");
                        assert_eq!(json.capacity(), r.json_len_bound(), "grew");
                    }
                }
            }
        }
    }

    #[test]
    fn inline_result_round_trips() {
        let headers: &[(&[u8], &[u8])] = &[
            (b"Set-Cookie", b"a=1"),
            (b"Set-Cookie", b"b=2"),
            (b"X-Bin", b"\xff\x00"),
        ];
        let r = RequestResult {
            request_id: "req_1",
            status: 404,
            headers,
            header_names_are_tokens: false,
            body: ResultBody::Inline(b"hello"),
            timing: Timing {
                routing_ms: 0,
                assignment_ms: 1,
                egress_ms: 20,
                total_ms: 21,
            },
        };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["request_id"], "req_1");
        assert_eq!(v["status"], 404);
        assert_eq!(v["headers"][0]["name"], "Set-Cookie");
        assert_eq!(v["headers"][0]["value_base64"], "YT0x");
        assert_eq!(v["headers"][1]["value_base64"], "Yj0y");
        assert_eq!(v["headers"][2]["value_base64"], "/wA=");
        assert_eq!(v["body"]["mode"], "inline_base64");
        assert_eq!(v["body"]["data_base64"], "aGVsbG8=");
        assert_eq!(v["body"]["truncated"], false);
        assert_eq!(v["timing"]["egress_ms"], 20);
        assert_eq!(v["timing"]["total_ms"], 21);
        // Behind room for a head: the same document after that many zero bytes, in one
        // allocation.
        let behind = r.to_json_behind(256);
        assert_eq!(behind.get(..256), Some(&[0u8; 256][..]));
        assert_eq!(behind.get(256..), Some(&r.to_json()[..]));
        assert!(behind.capacity() <= 256 + r.json_len_bound());
        // Token names read the same whether they are looked at or taken as tokens.
        let unchecked = RequestResult {
            header_names_are_tokens: true,
            ..r
        };
        assert_eq!(unchecked.to_json(), r.to_json());
    }

    /// Numbers are written in decimal whatever their size: the single digits pushed as one
    /// byte read as the rest do.
    #[test]
    fn numbers_are_written_in_decimal() {
        let mut out = Vec::new();
        for n in [0u64, 1, 9, 10, 11, 99, 100, 255, 256, 1_000, u64::MAX] {
            out.clear();
            write_u64(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    #[test]
    fn receipt_result_and_empty_body() {
        let r = RequestResult {
            request_id: "req_2",
            status: 200,
            headers: &[],
            header_names_are_tokens: true,
            body: ResultBody::Receipt {
                receipt_id: "rcpt_x",
                size_bytes: u64::MAX,
                sha256_hex: "ab",
            },
            timing: Timing::default(),
        };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["body"]["mode"], "receipt");
        assert_eq!(v["body"]["size_bytes"], u64::MAX);
        assert!(v["body"].get("truncated").is_none());
        assert_eq!(v["headers"].as_array().unwrap().len(), 0);
        let r = RequestResult {
            body: ResultBody::Inline(b""),
            ..r
        };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["body"]["data_base64"], "");
    }

    /// Token names are copied, anything else escaped: each way the name reads back the same.
    #[test]
    fn names_are_copied_or_escaped() {
        for (name, shown) in [
            (&b"Content-Type"[..], "Content-Type"),
            (b"x!#$%&'*+-.^_`|~09", "x!#$%&'*+-.^_`|~09"),
            (b"with space", "with space"),
            (b"q\"uo\\te", "q\"uo\\te"),
            (b"ctl\x01", "ctl\u{1}"),
            (b"bad\xff", "bad\u{fffd}"),
        ] {
            let mut out = Vec::new();
            write_name(&mut out, name);
            let v: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(v, shown);
        }
    }

    #[test]
    fn a_body_in_two_parts_encodes_as_one() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for len in [0usize, 1, 2, 3, 4, 5, 7, 64, 999, 1000] {
            let body = &data[..len];
            for split in 0..=len.min(9) {
                let (a, b) = body.split_at(split);
                let mut whole = Vec::new();
                write_b64(&mut whole, body);
                let mut parts = Vec::new();
                write_b64_parts(&mut parts, a, b);
                assert_eq!(parts, whole, "len {len} split {split}");
                let (a, b) = body.split_at(len - split);
                let mut parts = Vec::new();
                write_b64_parts(&mut parts, a, b);
                assert_eq!(parts, whole, "len {len} split {}", len - split);
            }
        }
    }
}
