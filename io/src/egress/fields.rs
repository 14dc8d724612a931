//! The header fields of a destination's response, as received: names as spelled, raw values,
//! order and duplicates kept.
//!
//! A head read over HTTP/1.1 keeps its fields as the head's buffer and where each name and
//! value lies in it: reading them touches no reference count, where a pair of `Bytes` per
//! field cost two atomic increments and two decrements per field of every response. Fields
//! that arrive as separate pieces (HTTP/2) are copied into one buffer; the worker bus decodes
//! a head's fields into one buffer of its own ([`HeadFields`]), kept as it is.
//!
//! An HTTP/1.1 head's fields are also its field lines: where they were checked to lie as the
//! parser accepted them, a relay copies a run of them in one piece ([`ResponseFields::lines`]).

use std::cell::Cell;
#[cfg(test)]
use std::ops::Range;

use bytes::Bytes;
use sortie_core::bus::HeadFields;
use sortie_core::h1::FieldOffsets;
use sortie_core::proxy::{connection_tokens_of, ConnectionTokens};

/// Where one field's name and value lie in [`ResponseFields`]' buffer: for an HTTP/1.1 head,
/// the offsets its parser gave, kept as they are.
type Span = FieldOffsets;

/// A response head's fields in order: they lie in one buffer, and for a head the HTTP/1.1
/// parser read, they may be the head's field lines ([`ResponseFields::lines`]).
#[derive(Clone, Debug, Default)]
pub struct ResponseFields {
    buf: Bytes,
    spans: Vec<Span>,
    /// Whether the fields are the parser's, in the buffer it parsed: their names are tokens.
    is_parsed: bool,
    /// Whether they are the head's lines: checked when first asked, since only a relay asks
    /// (the request API reads fields one by one and never does).
    lines: Cell<Lines>,
}

/// What is known of whether [`ResponseFields`] are a head's field lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Lines {
    /// Not a parsed head's fields, or fields found not to be laid out as its lines.
    #[default]
    No,
    /// A parsed head's fields whose field section ends here, not yet checked.
    Unchecked(u32),
    /// Checked: the head's lines, the last ending here.
    EndAt(u32),
}

impl ResponseFields {
    /// Fields whose names and values lie in `buf` at `spans`; `None` when `buf` is shorter than
    /// the buffer the spans were checked against.
    pub fn in_buffer(buf: Bytes, spans: FieldSpans) -> Option<ResponseFields> {
        if spans.len > buf.len() {
            return None;
        }
        // Lines and tokens only in the very buffer the parser's offsets were checked against.
        let is_same = spans.len == buf.len();
        let lines = match spans.section_end {
            Some(end) if is_same => Lines::Unchecked(end),
            _ => Lines::No,
        };
        Some(ResponseFields {
            buf,
            spans: spans.spans,
            is_parsed: is_same && spans.section_end.is_some(),
            lines: Cell::new(lines),
        })
    }

    /// Fields copied into one buffer.
    pub fn copied<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        fields: impl IntoIterator<Item = (N, V)>,
    ) -> ResponseFields {
        ResponseFields::decoded(HeadFields::copied(fields))
    }

    /// Fields the worker bus decoded into one buffer, kept in it.
    pub fn decoded(fields: HeadFields) -> ResponseFields {
        let (buf, spans) = fields.into_parts();
        ResponseFields {
            buf,
            spans,
            is_parsed: false,
            lines: Cell::new(Lines::No),
        }
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fields in order, as (name, value).
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            buf: &self.buf,
            spans: self.spans.iter(),
        }
    }

    /// The buffer the fields lie in and where each lies: what the worker bus writes as one
    /// block (`sortie_core::bus::encode_response_block`).
    pub fn block(&self) -> (&[u8], &[Span]) {
        (&self.buf, &self.spans)
    }

    /// The field at `index`.
    pub fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        self.spans.get(index).map(|s| s.read(&self.buf))
    }

    /// The field lines of fields `first..past`, as received (`name ":" OWS value OWS CRLF`
    /// each), when these fields are a head's lines (`are_lines`); `None`
    /// otherwise, or for an empty or out-of-range run.
    pub fn lines(&self, first: usize, past: usize) -> Option<&[u8]> {
        let end = self.lines_end()?;
        let start = self.spans.get(first)?.name.0;
        let end = match self.spans.get(past) {
            Some(next) => next.name.0,
            None if past == self.spans.len() => end,
            None => return None,
        };
        self.buf
            .get(start as usize..end as usize)
            .filter(|l| !l.is_empty())
    }

    /// Whether [`ResponseFields::lines`] answers.
    pub fn has_lines(&self) -> bool {
        self.lines_end().is_some()
    }

    /// Where the last field line ends, when the fields are the head's lines: checked on the
    /// first call (`are_lines`), remembered after.
    fn lines_end(&self) -> Option<u32> {
        match self.lines.get() {
            Lines::No => None,
            Lines::EndAt(end) => Some(end),
            Lines::Unchecked(end) => {
                let found = are_lines(&self.buf, &self.spans, end as usize);
                self.lines
                    .set(if found { Lines::EndAt(end) } else { Lines::No });
                found.then_some(end)
            }
        }
    }

    /// Whether every name is known to be a token without a look at it: the fields are the
    /// HTTP/1.1 parser's, which accepts no other names. Fields from elsewhere (HTTP/2, the
    /// worker bus) answer false.
    pub fn names_are_tokens(&self) -> bool {
        self.is_parsed
    }

    /// The value of the first field named `name`, ignoring ASCII case.
    pub fn value(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The names the `Connection` fields list ([`connection_tokens_of`]). Other fields are
    /// passed over by the length of their name, without reading them: this runs for every
    /// relayed head.
    pub fn connection_tokens(&self) -> ConnectionTokens<'_> {
        const NAME_LEN: u32 = b"connection".len() as u32;
        connection_tokens_of(
            self.spans
                .iter()
                .filter(|s| s.name.1.saturating_sub(s.name.0) == NAME_LEN)
                .map(|s| s.read(&self.buf)),
        )
    }

    /// The field at `index` as slices sharing the buffer, for a caller that keeps them.
    pub fn shared(&self, index: usize) -> Option<(Bytes, Bytes)> {
        let s = self.spans.get(index)?;
        // Checked first: `Bytes::slice` panics outside the buffer.
        let part = |(start, end): (u32, u32)| {
            let range = start as usize..end as usize;
            self.buf.get(range.clone())?;
            Some(self.buf.slice(range))
        };
        Some((part(s.name)?, part(s.value)?))
    }
}

/// Where a head's fields lie in a buffer of a known length, checked: made while the parsed
/// head still borrows its buffer, then given to [`ResponseFields::in_buffer`] with the buffer.
pub struct FieldSpans {
    spans: Vec<Span>,
    /// The length of the buffer the ranges were checked against.
    len: usize,
    /// For the parser's fields: where the head's field section ends (its lines checked later,
    /// if ever asked for).
    section_end: Option<u32>,
}

impl FieldSpans {
    /// The ranges, each within `0..len`; `None` when one is not (or is reversed). For tests,
    /// which lay spans over buffers of their choosing; the request path takes the parser's
    /// offsets ([`FieldSpans::parsed`]), checked the same way.
    #[cfg(test)]
    pub fn within(
        len: usize,
        ranges: impl ExactSizeIterator<Item = (Range<usize>, Range<usize>)>,
    ) -> Option<FieldSpans> {
        let at = |r: Range<usize>| -> Option<(u32, u32)> {
            Some((u32::try_from(r.start).ok()?, u32::try_from(r.end).ok()?))
        };
        let spans = ranges
            .map(|(name, value)| {
                Some(Span {
                    name: at(name)?,
                    value: at(value)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        are_within(&spans, len).then_some(FieldSpans {
            spans,
            len,
            section_end: None,
        })
    }

    /// The fields the parser found in the head at the start of `buf` (`head_len` bytes long,
    /// [`sortie_core::h1::parse_response_head_offsets`]), checked against `buf`; whether they
    /// lie as its lines (`are_lines`) is checked when a relay first asks
    /// ([`ResponseFields::lines`]). `None` when one lies outside `buf` or is reversed.
    pub fn parsed(buf: &[u8], fields: Vec<FieldOffsets>, head_len: usize) -> Option<FieldSpans> {
        if !are_within(&fields, buf.len()) {
            return None;
        }
        Some(FieldSpans {
            spans: fields,
            len: buf.len(),
            // The field lines end before the empty line (the head's last two bytes).
            section_end: u32::try_from(head_len.saturating_sub(2)).ok(),
        })
    }
}

/// Whether every name and value of `spans` lies within `0..len`, none reversed.
fn are_within(spans: &[Span], len: usize) -> bool {
    spans.iter().all(|s| s.is_within(len))
}

/// Whether `spans` are the field lines of the head in `buf` whose last line ends at `end`
/// (before the empty line), each laid out as the parser accepted it: the line starts with the
/// name, a colon follows it, only SP or HTAB stand between the colon and the value and between
/// the value and the CRLF that ends the line, and the next line starts with the next field's
/// name. No fields are no lines.
fn are_lines(buf: &[u8], spans: &[Span], end: usize) -> bool {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    // One line: the name, its colon and the OWS before the value (`": "` the common case), the
    // value, OWS and the CRLF that ends the line at `line_end`.
    let is_line = |s: &Span, line_end: usize| {
        let (name_end, value_start, value_end) =
            (s.name.1 as usize, s.value.0 as usize, s.value.1 as usize);
        let is_gap = match buf.get(name_end..value_start) {
            Some(b": " | b":") => true,
            Some([b':', ows @ ..]) => ows.iter().all(is_ows),
            _ => false,
        };
        let is_end = match buf.get(value_end..line_end) {
            Some(b"\r\n") => true,
            Some([ows @ .., b'\r', b'\n']) => ows.iter().all(is_ows),
            _ => false,
        };
        s.name.0 < s.name.1 && is_gap && is_end
    };
    let Some(last) = spans.last() else {
        return false;
    };
    spans.windows(2).all(|pair| match pair {
        [s, next] => is_line(s, next.name.0 as usize),
        _ => false,
    }) && is_line(last, end)
}

/// The iterator of [`ResponseFields::iter`].
#[derive(Clone)]
pub struct Iter<'a> {
    buf: &'a Bytes,
    spans: std::slice::Iter<'a, Span>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        // Ranges checked when the spans were made: the empty fallback is never taken.
        self.spans.next().map(|s| s.read(self.buf))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a ResponseFields {
    type Item = (&'a [u8], &'a [u8]);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl Eq for ResponseFields {}

impl PartialEq for ResponseFields {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// The fields of a head parsed as `client::read_head` parses a destination's, for tests.
#[cfg(test)]
pub(crate) fn parsed(head: &'static [u8]) -> ResponseFields {
    use sortie_core::h1::{parse_response_head_offsets, HeadLimits, Parsed};
    let mut fields = Vec::new();
    let Ok(Parsed::Complete { consumed_len, .. }) =
        parse_response_head_offsets(head, "GET", &HeadLimits::RESPONSE, &mut fields)
    else {
        panic!("a complete head");
    };
    let spans = FieldSpans::parsed(head, fields, consumed_len).expect("within the buffer");
    ResponseFields::in_buffer(Bytes::from_static(head), spans).expect("the same buffer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(f: &ResponseFields) -> Vec<(Vec<u8>, Vec<u8>)> {
        f.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
    }

    /// The three ways to make fields read the same, in order, duplicates kept; lookups ignore
    /// case and find the first; shared slices are the same bytes.
    #[test]
    fn every_form_reads_the_same() {
        let want = vec![
            (b"Server".to_vec(), b"x".to_vec()),
            (b"Set-Cookie".to_vec(), b"a=1".to_vec()),
            (b"set-cookie".to_vec(), b"".to_vec()),
        ];
        let head = Bytes::from_static(b"Server: x\r\nSet-Cookie: a=1\r\nset-cookie:\r\n");
        let ranges = [(0..6, 8..9), (11..21, 23..26), (28..38, 39..39)];
        let spans = FieldSpans::within(head.len(), ranges.into_iter()).expect("within the buffer");
        let in_buffer = ResponseFields::in_buffer(head, spans).expect("the same buffer");
        let copied = ResponseFields::copied(want.iter().map(|(n, v)| (n, v)));
        let decoded = ResponseFields::decoded(
            HeadFields::in_buffer(
                Bytes::from_static(b"Serverx-Set-Cookie:a=1;set-cookie"),
                [((0, 6), (6, 7)), ((8, 18), (19, 22)), ((23, 33), (33, 33))]
                    .into_iter()
                    .map(|(name, value)| FieldOffsets { name, value })
                    .collect(),
            )
            .expect("within the buffer"),
        );
        for f in [&in_buffer, &copied, &decoded] {
            assert_eq!(pairs(f), want);
            assert_eq!(f.len(), 3);
            assert_eq!(f.iter().len(), 3);
            assert_eq!(f.value(b"SET-COOKIE"), Some(&b"a=1"[..]));
            assert_eq!(f.value(b"missing"), None);
            assert!(f.connection_tokens().is_empty());
            let (n, v) = f.shared(1).expect("a second field");
            assert_eq!((&n[..], &v[..]), (&b"Set-Cookie"[..], &b"a=1"[..]));
            assert!(f.shared(3).is_none());
            assert!(f.get(3).is_none());
        }
        assert_eq!(in_buffer, copied);
        assert_eq!(copied, decoded);
        assert!(ResponseFields::default().is_empty());
        let listing = [
            ("X", "1"),
            ("Connection", "a, b"),
            ("connectionX", "c"),
            ("CONNECTION", "d"),
        ];
        for f in [
            ResponseFields::copied(listing),
            ResponseFields::decoded(listing.iter().copied().collect()),
        ] {
            assert_eq!(*f.connection_tokens(), [&b"a"[..], b"b", b"d"]);
        }
    }

    /// A parsed head's fields are its lines: a run of them reads as received, spacing kept, and
    /// an empty or out-of-range run reads as none. Copied fields are no lines.
    #[test]
    fn a_parsed_heads_fields_are_its_lines() {
        let f = parsed(b"HTTP/1.1 200 OK\r\nServer: x\r\nA:1\r\nB: \t2 \r\nC:\r\n\r\nbody");
        // Tokens at once; the layout only when asked, then remembered.
        assert!(f.names_are_tokens());
        assert_eq!(f.lines.get(), Lines::Unchecked(45));
        assert!(f.has_lines());
        assert_eq!(f.lines.get(), Lines::EndAt(45));
        assert_eq!(f.len(), 4);
        assert_eq!(f.lines(0, 1), Some(&b"Server: x\r\n"[..]));
        assert_eq!(f.lines(1, 3), Some(&b"A:1\r\nB: \t2 \r\n"[..]));
        assert_eq!(f.lines(3, 4), Some(&b"C:\r\n"[..]));
        assert_eq!(
            f.lines(0, 4),
            Some(&b"Server: x\r\nA:1\r\nB: \t2 \r\nC:\r\n"[..])
        );
        for (first, past) in [(2, 2), (3, 2), (4, 5), (0, 5), (9, 10)] {
            assert_eq!(f.lines(first, past), None, "{first}..{past}");
        }
        assert_eq!(f.value(b"b"), Some(&b"2"[..]));
        let copied = ResponseFields::copied(f.iter());
        assert_eq!(copied, f);
        assert!(!copied.has_lines());
        assert_eq!(copied.lines(0, 1), None);
        assert!(!ResponseFields::decoded(HeadFields::default()).has_lines());
        // Only the parser's fields are taken for tokens unseen (the request API's envelope).
        assert!(f.names_are_tokens());
        assert!(!copied.names_are_tokens());
        assert!(!ResponseFields::decoded(HeadFields::default()).names_are_tokens());
    }

    /// Fields laid out otherwise than a head's lines are fields only: a line between two
    /// fields, a line end that is not CRLF, a last line that does not end where said, a
    /// different buffer.
    #[test]
    fn fields_off_the_line_layout_are_not_lines() {
        // Spans checked against `within` bytes, as the parser's fields of a head whose field
        // section ends at `end`, laid over `buf`.
        let laid = |buf: &[u8], within: usize, ranges: &[(Range<usize>, Range<usize>)], end| {
            let spans = FieldSpans {
                section_end: Some(end),
                ..FieldSpans::within(within, ranges.iter().cloned()).expect("within")
            };
            let fields = ResponseFields::in_buffer(Bytes::copy_from_slice(buf), spans);
            fields.expect("the buffer is long enough").has_lines()
        };
        let lines = |buf: &[u8], ranges: &[(Range<usize>, Range<usize>)], end| {
            laid(buf, buf.len(), ranges, end)
        };
        let buf = b"A: 1\r\nX: y\r\nB: 2\r\n";
        assert!(lines(
            buf,
            &[(0..1, 3..4), (6..7, 9..10), (12..13, 15..16)],
            18
        ));
        // The middle line is not a field of the list.
        assert!(!lines(buf, &[(0..1, 3..4), (12..13, 15..16)], 18));
        // The last line said to end early, or late.
        assert!(!lines(
            buf,
            &[(0..1, 3..4), (6..7, 9..10), (12..13, 15..16)],
            17
        ));
        assert!(!lines(
            buf,
            &[(0..1, 3..4), (6..7, 9..10), (12..13, 15..16)],
            19
        ));
        // A value that stops short of its line's end, a name not followed by a colon.
        assert!(!lines(
            buf,
            &[(0..1, 3..3), (6..7, 9..10), (12..13, 15..16)],
            18
        ));
        assert!(!lines(
            buf,
            &[(0..2, 3..4), (6..7, 9..10), (12..13, 15..16)],
            18
        ));
        // A bare LF ends no line.
        let bare = b"A: 1\nB: 2\r\n";
        assert!(!lines(bare, &[(0..1, 3..4), (5..6, 8..9)], 11));
        // Spans checked against another buffer's length.
        assert!(laid(b"A: 1\r\n", 6, &[(0..1, 3..4)], 6));
        assert!(!laid(b"A: 1\r\n..", 6, &[(0..1, 3..4)], 6));
    }

    /// A range outside the buffer, or reversed, is refused rather than read as something else.
    #[test]
    fn ranges_outside_the_buffer_are_refused() {
        let buf = Bytes::from_static(b"A: b");
        assert!(FieldSpans::within(buf.len(), [(0..1, 3..5)].into_iter()).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = [(1..0, 3..4)];
        assert!(FieldSpans::within(buf.len(), reversed.into_iter()).is_none());
        let spans = FieldSpans::within(buf.len(), [(0..1, 3..4)].into_iter()).expect("within");
        // Spans checked against a longer buffer are not laid over a shorter one.
        let longer = FieldSpans::within(8, [(0..1, 3..8)].into_iter()).expect("within 8");
        assert!(ResponseFields::in_buffer(buf.clone(), longer).is_none());
        assert!(ResponseFields::in_buffer(buf, spans).is_some());
        // The parser's offsets go through the same check.
        let at = |name: (u32, u32), value: (u32, u32)| vec![FieldOffsets { name, value }];
        let head = b"A: b\r\n\r\n";
        assert!(FieldSpans::parsed(head, at((0, 1), (3, 4)), 8).is_some());
        assert!(FieldSpans::parsed(head, at((0, 1), (3, 9)), 8).is_none());
        assert!(FieldSpans::parsed(head, at((1, 0), (3, 4)), 8).is_none());
    }
}
