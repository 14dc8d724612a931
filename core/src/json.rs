//! Strict JSON: decoding with simd-json into typed values (unknown fields, duplicate keys,
//! trailing values and invalid UTF-8 rejected), with messages of our own, and a small writer for
//! the hot-path encoders.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Visitor};

/// Why a strict JSON document was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The document exceeds the size limit; nothing was parsed.
    #[error("JSON document of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Size of the document.
        size: usize,
        /// The limit that applied.
        limit: usize,
    },
    /// The document is not UTF-8.
    #[error("JSON document is not valid UTF-8")]
    InvalidUtf8,
    /// The document is empty or only whitespace.
    #[error("JSON document is empty")]
    Empty,
    /// The document is syntactically or structurally invalid (the message names what).
    #[error("invalid JSON: {0}")]
    Invalid(String),
}

/// Documents up to this size are parsed with per-thread reused buffers; larger ones get fresh
/// buffers that are freed afterwards, so a thread never keeps more than this around.
const REUSE_BUFFERS_UP_TO: usize = 64 * 1024;

thread_local! {
    static PARSE_BUFFERS: std::cell::RefCell<Option<simd_json::Buffers>> =
        const { std::cell::RefCell::new(None) };
}

/// Decodes exactly one JSON value of type `T` from `buf`, in place (simd-json mutates the
/// buffer). `T` must be declared with `#[serde(deny_unknown_fields)]` at every level for the
/// strictness guarantees to hold; serde's derive rejects duplicate keys on its own.
pub fn from_slice_strict<'a, T: Deserialize<'a>>(
    buf: &'a mut [u8],
    limit: usize,
) -> Result<T, JsonError> {
    if buf.len() > limit {
        return Err(JsonError::TooLarge {
            size: buf.len(),
            limit,
        });
    }
    // UTF-8 is validated by simd-json's first stage, in the same pass that finds the
    // structure (vectorised, or the standard library's check where it has no vector code): a
    // check of our own before it read every byte of the envelope twice.
    if buf.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(JsonError::Empty);
    }
    let parsed = if buf.len() <= REUSE_BUFFERS_UP_TO {
        // simd-json copies the input into an aligned buffer and builds a tape; reusing those
        // buffers saves three allocations per small document (most request envelopes).
        PARSE_BUFFERS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut slot) => {
                let buffers =
                    slot.get_or_insert_with(|| simd_json::Buffers::new(REUSE_BUFFERS_UP_TO));
                simd_json::serde::from_slice_with_buffers::<T>(buf, buffers)
            }
            Err(_) => simd_json::serde::from_slice::<T>(buf),
        })
    } else {
        simd_json::serde::from_slice::<T>(buf)
    };
    parsed.map_err(|e| match e.error() {
        simd_json::ErrorType::InvalidUtf8 => JsonError::InvalidUtf8,
        _ => JsonError::Invalid(describe(&e)),
    })
}

/// Turns a simd-json error into a message that names the problem without echoing input bytes
/// beyond field names.
fn describe(e: &simd_json::Error) -> String {
    use simd_json::ErrorType as T;
    let what = match e.error() {
        T::Serde(s) => return clean_serde_message(s),
        T::TrailingData => "trailing data after the JSON value".into(),
        T::Eof => "unexpected end of input".into(),
        // simd-json reports several syntax errors, among them a second value after the first,
        // as an internal error.
        T::InternalError => "syntax error (malformed JSON or trailing data after the value)".into(),
        T::InvalidUtf8 => "invalid UTF-8".into(),
        T::InvalidEscape => "invalid string escape".into(),
        T::InvalidNumber => "invalid number".into(),
        T::InvalidExponent => "invalid number exponent".into(),
        T::Overflow => "number out of range".into(),
        T::ExpectedArray => "expected an array".into(),
        T::ExpectedMap => "expected an object".into(),
        T::ExpectedString => "expected a string".into(),
        T::ExpectedBoolean => "expected a boolean".into(),
        T::ExpectedInteger | T::ExpectedUnsigned | T::ExpectedSigned => {
            "expected an integer".into()
        }
        other => format!("{other:?}").to_lowercase(),
    };
    match e.index() {
        0 => what,
        i => format!("{what} at byte {i}"),
    }
}

fn clean_serde_message(s: &str) -> String {
    // serde's messages are already precise ("unknown field `x`, expected one of ...",
    // "duplicate field `x`", "missing field `x`"); cut them so a hostile key cannot make the
    // message large.
    let mut m = s.to_string();
    if m.len() > 200 {
        let mut cut = 200;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
        m.push('…');
    }
    m
}

/// A string that borrows from the parsed buffer when it can (simd-json unescapes in place, so it
/// nearly always can), saving an allocation per field on the hot path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CowStr<'a>(pub Cow<'a, str>);

impl CowStr<'_> {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An owned copy.
    pub fn into_owned(self) -> String {
        self.0.into_owned()
    }
}

impl std::ops::Deref for CowStr<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for CowStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = CowStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// Whether `b` is written escaped in a JSON string.
const fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f
}

/// The high bit of each byte of `w` that [`needs_escape`].
#[inline]
fn escapes(w: u64) -> u64 {
    use crate::ascii::{bytes_below, bytes_eq};
    bytes_below(w, 0x20) | bytes_eq(w, b'"') | bytes_eq(w, b'\\') | bytes_eq(w, 0x7f)
}

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut rest = s.as_bytes();
    // Text without escapes (nearly all) is found by one scan, eight bytes at a time, and
    // copied at once.
    while let Some(at) = crate::ascii::position(rest, escapes, needs_escape) {
        let (clean, tail) = rest.split_at(at);
        out.extend_from_slice(clean);
        let Some((&b, after)) = tail.split_first() else {
            break;
        };
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                out.extend_from_slice(b"\\u00");
                out.extend_from_slice(&crate::hex::pair(b));
            }
        }
        rest = after;
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        inner: Inner,
        #[serde(default)]
        name: Option<String>,
    }

    fn dec(s: &[u8]) -> Result<Outer, JsonError> {
        let mut v = s.to_vec();
        from_slice_strict(&mut v, 1024)
    }

    #[test]
    fn accepts_strict_document() {
        assert_eq!(
            dec(br#" {"inner":{"a":1},"name":"x"} "#).unwrap(),
            Outer {
                inner: Inner { a: 1 },
                name: Some("x".into())
            }
        );
    }

    #[test]
    fn rejects_everything_loose() {
        let cases: &[&[u8]] = &[
            br#"{"inner":{"a":1},"extra":1}"#,
            br#"{"inner":{"a":1,"b":2}}"#,
            br#"{"inner":{"a":1},"inner":{"a":2}}"#,
            br#"{"inner":{"a":1}} {"inner":{"a":1}}"#,
            br#"{"inner":{"a":1}} x"#,
            b"{\"inner\":{\"a\":1},\"name\":\"\xff\"}",
            b"",
            b"   ",
            br#"{"inner":{"a":-1}}"#,
            br#"{"inner":{"a":1.5}}"#,
            br#"[1]"#,
            br#"{"inner":{"a":1}"#,
        ];
        for c in cases {
            assert!(dec(c).is_err(), "accepted {:?}", String::from_utf8_lossy(c));
        }
    }

    /// Bytes that are not UTF-8 are refused as such wherever they stand: in a value, in a key,
    /// between tokens, after the value, at either end, across a 64-byte block of the parser.
    #[test]
    fn invalid_utf8_is_named_wherever_it_stands() {
        let padding = "x".repeat(38);
        let cases: Vec<Vec<u8>> = vec![
            b"{\"inner\":{\"a\":1},\"name\":\"\xff\"}".to_vec(),
            b"{\"inner\":{\"a\":1},\"name\":\"ok\xc3\"}".to_vec(),
            b"{\"in\xe2\x82ner\":{\"a\":1}}".to_vec(),
            b"{\"inner\":{\"a\":1}}\xff".to_vec(),
            b"\xef\xbb{\"inner\":{\"a\":1}}".to_vec(),
            b"{\"inner\":{\"a\":1},\"name\":\"\xed\xa0\x80\"}".to_vec(),
            // A sequence cut short at the last byte of the parser's first 64-byte block.
            format!("{{\"inner\":{{\"a\":1}},\"name\":\"{padding}")
                .into_bytes()
                .into_iter()
                .chain([0xc3])
                .chain(*b"\"}")
                .collect(),
        ];
        for mut c in cases {
            let shown = String::from_utf8_lossy(&c).into_owned();
            assert_eq!(
                from_slice_strict::<Outer>(&mut c, 1 << 20).map(|_| ()),
                Err(JsonError::InvalidUtf8),
                "{shown}"
            );
        }
        let mut fine = "{\"inner\":{\"a\":1},\"name\":\"caf\u{e9} \u{1f600}\"}"
            .as_bytes()
            .to_vec();
        let decoded = from_slice_strict::<Outer>(&mut fine, 1 << 20).unwrap();
        assert_eq!(decoded.name.as_deref(), Some("caf\u{e9} \u{1f600}"));
    }

    #[test]
    fn size_limit_is_checked_first() {
        let mut v = vec![b' '; 2000];
        assert_eq!(
            from_slice_strict::<Outer>(&mut v, 1024),
            Err(JsonError::TooLarge {
                size: 2000,
                limit: 1024
            })
        );
    }

    #[test]
    fn write_str_escapes() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\n\u{0}\u{7f}é");
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, "a\"b\\c\n\u{0}\u{7f}é");
    }

    /// An escape anywhere, before, inside or after the runs skipped whole, is written escaped.
    #[test]
    fn write_str_escapes_at_every_position() {
        for len in 0..50 {
            for at in 0..len {
                for special in ['"', '\\', '\n', '\u{1}', '\u{7f}'] {
                    let text: String = (0..len)
                        .map(|i| if i == at { special } else { 'x' })
                        .collect();
                    let mut out = Vec::new();
                    write_str(&mut out, &text);
                    let back: String = serde_json::from_slice(&out).unwrap();
                    assert_eq!(back, text);
                    let inner = &out[1..out.len() - 1];
                    assert!(!inner.iter().any(|&b| b < 0x20 || b == 0x7f), "{text:?}");
                    assert_eq!(inner.len(), len - 1 + escaped_len(special), "{text:?}");
                }
            }
        }
    }

    fn escaped_len(c: char) -> usize {
        match c {
            '"' | '\\' | '\n' => 2,
            _ => 6,
        }
    }
}
