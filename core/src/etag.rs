//! ETags and `If-Match` of the admin API: a revision number `12` is sent as the ETag `"12"`, and
//! `If-Match` accepts the quoted ETag or its bare numeric contents (spec, Admin API rule 1).

use std::fmt;

use crate::error::AdminErrorKind;

/// Digits of `u64::MAX`; a longer number cannot be a revision.
const MAX_REVISION_DIGITS: usize = 20;

/// Why an `If-Match` header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfMatchError {
    /// The header is absent on a mutation (428 `if_match_required`).
    Missing,
    /// The header is neither `"N"` nor `N` for a revision number N (400 `invalid_if_match`).
    Invalid,
}

impl IfMatchError {
    /// The admin API error this maps to.
    pub const fn kind(self) -> AdminErrorKind {
        match self {
            IfMatchError::Missing => AdminErrorKind::IfMatchRequired,
            IfMatchError::Invalid => AdminErrorKind::InvalidIfMatch,
        }
    }
}

impl fmt::Display for IfMatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind().as_str())
    }
}

impl std::error::Error for IfMatchError {}

/// The ETag of a revision: the number in double quotes, `"12"`.
pub fn etag(revision: u64) -> String {
    format!("\"{revision}\"")
}

/// Parses an `If-Match` header value into the revision it names.
///
/// Accepted: `"12"` (the ETag as sent) and `12` (its numeric contents), with optional
/// surrounding spaces or tabs (RFC 9110 §5.5 OWS). Refused as [`IfMatchError::Invalid`]: weak
/// tags (`W/"12"`, which RFC 9110 §13.1.1 excludes from If-Match's strong comparison), `*`,
/// lists, the empty value, signs, leading zeros (`"012"` is not an ETag this service ever
/// sent), whitespace inside the quotes, non-ASCII digits and numbers above `u64::MAX`.
pub fn parse_if_match(header: &str) -> Result<u64, IfMatchError> {
    let value = header.trim_matches([' ', '\t']);
    let digits = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or(IfMatchError::Invalid)?,
        None => value,
    };
    let bytes = digits.as_bytes();
    let well_formed = !bytes.is_empty()
        && bytes.len() <= MAX_REVISION_DIGITS
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes.len() == 1 || bytes.first() != Some(&b'0'));
    if !well_formed {
        return Err(IfMatchError::Invalid);
    }
    let mut revision: u64 = 0;
    for &b in bytes {
        revision = revision
            .checked_mul(10)
            .and_then(|r| r.checked_add(u64::from(b - b'0')))
            .ok_or(IfMatchError::Invalid)?;
    }
    Ok(revision)
}

/// Parses an optional `If-Match` header: absent is [`IfMatchError::Missing`] (428), present is
/// [`parse_if_match`].
pub fn require_if_match(header: Option<&str>) -> Result<u64, IfMatchError> {
    header.map_or(Err(IfMatchError::Missing), parse_if_match)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_is_quoted() {
        assert_eq!(etag(0), "\"0\"");
        assert_eq!(etag(12), "\"12\"");
        assert_eq!(etag(u64::MAX), "\"18446744073709551615\"");
        for r in [0, 1, 9, 10, 12, 999, u64::MAX - 1, u64::MAX] {
            assert_eq!(parse_if_match(&etag(r)), Ok(r));
        }
    }

    #[test]
    fn if_match_forms() {
        use IfMatchError::Invalid;
        let table: &[(&str, Result<u64, IfMatchError>)] = &[
            ("\"12\"", Ok(12)),
            ("12", Ok(12)),
            ("  \"12\"\t", Ok(12)),
            ("\t12 ", Ok(12)),
            ("\"0\"", Ok(0)),
            ("0", Ok(0)),
            ("18446744073709551615", Ok(u64::MAX)),
            ("\"18446744073709551615\"", Ok(u64::MAX)),
            ("18446744073709551616", Err(Invalid)),
            ("99999999999999999999", Err(Invalid)),
            ("000000000000000000001", Err(Invalid)),
            ("", Err(Invalid)),
            ("   ", Err(Invalid)),
            ("\"\"", Err(Invalid)),
            ("\"", Err(Invalid)),
            ("\"12", Err(Invalid)),
            ("12\"", Err(Invalid)),
            ("W/\"12\"", Err(Invalid)),
            ("w/\"12\"", Err(Invalid)),
            ("*", Err(Invalid)),
            ("\"*\"", Err(Invalid)),
            ("\"12\", \"13\"", Err(Invalid)),
            ("12,13", Err(Invalid)),
            ("+12", Err(Invalid)),
            ("-12", Err(Invalid)),
            ("\"+12\"", Err(Invalid)),
            ("012", Err(Invalid)),
            ("\"012\"", Err(Invalid)),
            ("\" 12\"", Err(Invalid)),
            ("\"12 \"", Err(Invalid)),
            ("1 2", Err(Invalid)),
            ("12a", Err(Invalid)),
            ("0x12", Err(Invalid)),
            ("1e3", Err(Invalid)),
            ("١٢", Err(Invalid)),
            ("\u{a0}12", Err(Invalid)),
            ("\"\"12\"\"", Err(Invalid)),
            ("'12'", Err(Invalid)),
        ];
        for (header, want) in table {
            assert_eq!(parse_if_match(header), *want, "{header:?}");
        }
    }

    #[test]
    fn missing_and_invalid_map_to_admin_errors() {
        assert_eq!(require_if_match(None), Err(IfMatchError::Missing));
        assert_eq!(require_if_match(Some("\"3\"")), Ok(3));
        assert_eq!(require_if_match(Some("")), Err(IfMatchError::Invalid));
        assert_eq!(IfMatchError::Missing.kind().http_status(), 428);
        assert_eq!(IfMatchError::Invalid.kind().http_status(), 400);
        assert_eq!(IfMatchError::Invalid.to_string(), "invalid_if_match");
        assert_eq!(IfMatchError::Missing.to_string(), "if_match_required");
    }
}
