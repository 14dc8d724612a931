//! The receipt lifecycle: states with their wire names, the contract's transition table, and the
//! check that the uploaded part set is exactly 1..N at completion.
//!
//! The table lives in one function, [`ReceiptState::apply`]; the store persists its answer with a
//! compare-and-set on the previous state, so two racing triggers cannot both win.

use std::fmt;
use std::num::NonZeroU32;

use crate::error::receipt_error_json;
use crate::limits::{MAX_IDEMPOTENCY_KEY_BYTES, MAX_RECEIPT_METADATA_BYTES};

/// The state of a receipt (spec, States and transitions > Receipt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiptState {
    /// Created; parts may be uploaded.
    Uploading,
    /// `complete` composed the parts; size and SHA-256 are being checked.
    Verifying,
    /// Size and SHA-256 matched the declared values; ready for use.
    Verified,
    /// A worker holds signed access to the content.
    Assigned,
    /// A worker consumed the content.
    Consumed,
    /// Size or SHA-256 did not match at completion; never becomes verified.
    Rejected,
    /// Deleted by the client; the payload is removed.
    Cancelled,
    /// Past its `expires_at`; the payload is removed.
    Expired,
}

impl ReceiptState {
    /// Every state, in the order the contract lists them.
    pub const ALL: [ReceiptState; 8] = [
        ReceiptState::Uploading,
        ReceiptState::Verifying,
        ReceiptState::Verified,
        ReceiptState::Assigned,
        ReceiptState::Consumed,
        ReceiptState::Rejected,
        ReceiptState::Cancelled,
        ReceiptState::Expired,
    ];

    /// The state a receipt is created in by `POST /api/v1/receipts`.
    pub const INITIAL: ReceiptState = ReceiptState::Uploading;

    /// The wire name used in the receipt record's `state` field.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReceiptState::Uploading => "uploading",
            ReceiptState::Verifying => "verifying",
            ReceiptState::Verified => "verified",
            ReceiptState::Assigned => "assigned",
            ReceiptState::Consumed => "consumed",
            ReceiptState::Rejected => "rejected",
            ReceiptState::Cancelled => "cancelled",
            ReceiptState::Expired => "expired",
        }
    }

    /// Looks a state up by its wire name (for example, when loading a stored record).
    pub fn from_wire(s: &str) -> Option<ReceiptState> {
        ReceiptState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the state is terminal for assignment and completion: rejected, cancelled and
    /// expired (spec, States and transitions > Receipt).
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            ReceiptState::Rejected | ReceiptState::Cancelled | ReceiptState::Expired
        )
    }

    /// Whether the record shows `part_upload_template` and `complete_url` (spec: "present while
    /// state is uploading").
    pub const fn exposes_upload_urls(self) -> bool {
        matches!(self, ReceiptState::Uploading)
    }

    /// Whether a response receipt's record shows `download_url` (spec: "present on verified or
    /// consumed response receipts").
    pub const fn exposes_download_url(self) -> bool {
        matches!(self, ReceiptState::Verified | ReceiptState::Consumed)
    }

    /// Applies a trigger to a receipt in this state.
    ///
    /// The rows of the contract's table, plus the decisions it leaves open:
    ///
    /// | From | Event | To | Effect |
    /// |---|---|---|---|
    /// | uploading | [`UploadPart`](ReceiptEvent::UploadPart) | uploading | store the part |
    /// | uploading | [`Complete`](ReceiptEvent::Complete) with parts exactly 1..N | verifying | compose the parts |
    /// | uploading | `Complete` with any other part set | error 400, unchanged | |
    /// | verified | `Complete` (repeated) | verified, unchanged | none: an idempotent retry answers 200 with the record |
    /// | verifying | [`VerificationSucceeded`](ReceiptEvent::VerificationSucceeded) | verified | |
    /// | verifying | [`VerificationFailed`](ReceiptEvent::VerificationFailed) | rejected | |
    /// | verified | [`Assign`](ReceiptEvent::Assign) | assigned | |
    /// | assigned | [`AssignmentFailed`](ReceiptEvent::AssignmentFailed) | verified | |
    /// | assigned | [`Consume`](ReceiptEvent::Consume) | consumed | |
    /// | any but assigned and consumed | [`Cancel`](ReceiptEvent::Cancel) | cancelled | remove the payload |
    /// | assigned or consumed | `Cancel` | error 409, unchanged | |
    /// | uploading, verifying, verified, rejected, consumed | [`Expire`](ReceiptEvent::Expire) | expired | remove the payload |
    ///
    /// Everything else is an illegal transition (409) that leaves the state unchanged.
    ///
    /// Cancelling a cancelled receipt succeeds with the state unchanged ("repeat is safe") and
    /// asks again for the payload removal, which is idempotent, so that a removal interrupted
    /// the first time is finished by the retry.
    ///
    /// Expiry, which the contract leaves open, is driven by a sweeper once `expires_at` has
    /// passed. It skips an assigned receipt, because a worker is reading it right now; the
    /// sweeper tries again after the assignment ends in consumed or (failed) verified. A consumed
    /// receipt does expire: a consumed response receipt stays downloadable until its expiry and
    /// its payload must be reclaimed then. A rejected receipt expires too, so its payload is
    /// reclaimed even when the client never deletes it. Cancelled and expired receipts already
    /// have no payload and stay as they are.
    pub fn apply(self, event: ReceiptEvent) -> Result<Transition, TransitionError> {
        use ReceiptEvent as E;
        use ReceiptState as S;
        let (to, effect) = match (self, event) {
            (S::Uploading, E::UploadPart) => (S::Uploading, Effect::StorePart),
            (S::Uploading, E::Complete(Ok(_))) => (S::Verifying, Effect::ComposeParts),
            (S::Uploading, E::Complete(Err(e))) => return Err(TransitionError::Parts(e)),
            (S::Verified, E::Complete(_)) => (S::Verified, Effect::None),
            (S::Verifying, E::VerificationSucceeded) => (S::Verified, Effect::None),
            (S::Verifying, E::VerificationFailed) => (S::Rejected, Effect::None),
            (S::Verified, E::Assign) => (S::Assigned, Effect::None),
            (S::Assigned, E::AssignmentFailed) => (S::Verified, Effect::None),
            (S::Assigned, E::Consume) => (S::Consumed, Effect::None),
            (
                S::Uploading | S::Verifying | S::Verified | S::Rejected | S::Cancelled | S::Expired,
                E::Cancel,
            ) => (S::Cancelled, Effect::RemovePayload),
            (S::Uploading | S::Verifying | S::Verified | S::Rejected | S::Consumed, E::Expire) => {
                (S::Expired, Effect::RemovePayload)
            }
            (from, event) => {
                return Err(TransitionError::Illegal {
                    from,
                    event: event.kind(),
                })
            }
        };
        Ok(Transition {
            from: self,
            to,
            effect,
        })
    }
}

impl fmt::Display for ReceiptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A trigger of the receipt state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptEvent {
    /// `PUT /api/v1/receipts/{id}/parts/{part}`.
    UploadPart,
    /// `POST /api/v1/receipts/{id}/complete`, carrying [`check_parts`] of the uploaded part
    /// numbers.
    Complete(Result<PartCount, PartsError>),
    /// The composed object's byte count and SHA-256 equal the declared values.
    VerificationSucceeded,
    /// The composed object's byte count or SHA-256 differs from the declared values.
    VerificationFailed,
    /// The receipt is handed to a worker with signed access.
    Assign,
    /// The assignment failed before the worker consumed the content.
    AssignmentFailed,
    /// The worker consumed the content.
    Consume,
    /// `DELETE /api/v1/receipts/{id}`.
    Cancel,
    /// `expires_at` has passed.
    Expire,
}

/// The name of an event without its data, for errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// See [`ReceiptEvent::UploadPart`].
    UploadPart,
    /// See [`ReceiptEvent::Complete`].
    Complete,
    /// See [`ReceiptEvent::VerificationSucceeded`].
    VerificationSucceeded,
    /// See [`ReceiptEvent::VerificationFailed`].
    VerificationFailed,
    /// See [`ReceiptEvent::Assign`].
    Assign,
    /// See [`ReceiptEvent::AssignmentFailed`].
    AssignmentFailed,
    /// See [`ReceiptEvent::Consume`].
    Consume,
    /// See [`ReceiptEvent::Cancel`].
    Cancel,
    /// See [`ReceiptEvent::Expire`].
    Expire,
}

impl EventKind {
    /// What the event does, as a verb phrase for messages ("cannot {verb} a receipt ...").
    pub const fn verb(self) -> &'static str {
        match self {
            EventKind::UploadPart => "upload a part to",
            EventKind::Complete => "complete",
            EventKind::VerificationSucceeded => "mark as verified",
            EventKind::VerificationFailed => "mark as rejected",
            EventKind::Assign => "assign",
            EventKind::AssignmentFailed => "release the assignment of",
            EventKind::Consume => "consume",
            EventKind::Cancel => "cancel",
            EventKind::Expire => "expire",
        }
    }
}

impl ReceiptEvent {
    /// The event's name without its data.
    pub const fn kind(&self) -> EventKind {
        match self {
            ReceiptEvent::UploadPart => EventKind::UploadPart,
            ReceiptEvent::Complete(_) => EventKind::Complete,
            ReceiptEvent::VerificationSucceeded => EventKind::VerificationSucceeded,
            ReceiptEvent::VerificationFailed => EventKind::VerificationFailed,
            ReceiptEvent::Assign => EventKind::Assign,
            ReceiptEvent::AssignmentFailed => EventKind::AssignmentFailed,
            ReceiptEvent::Consume => EventKind::Consume,
            ReceiptEvent::Cancel => EventKind::Cancel,
            ReceiptEvent::Expire => EventKind::Expire,
        }
    }
}

/// What the caller must do to storage along with persisting the new state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing beyond the state.
    None,
    /// Store the uploaded part, replacing an existing part with the same number.
    StorePart,
    /// Compose the parts 1..N into the final object, then verify it.
    ComposeParts,
    /// Remove the parts and the final object. Idempotent.
    RemovePayload,
}

/// An allowed transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: ReceiptState,
    /// The state after; equal to `from` for an idempotent repeat.
    pub to: ReceiptState,
    /// What to do to storage.
    pub effect: Effect,
}

impl Transition {
    /// Whether the state stays as it was (a safe repeat or a part upload).
    pub fn is_unchanged(&self) -> bool {
        self.from == self.to
    }
}

/// Why a trigger was refused. The state is unchanged in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// The contract does not allow the trigger in this state (409).
    Illegal {
        /// The state of the receipt.
        from: ReceiptState,
        /// The refused trigger.
        event: EventKind,
    },
    /// `complete` found a part set other than exactly 1..N (400).
    Parts(PartsError),
}

impl TransitionError {
    /// The HTTP status of the receipt API answer. This is the only place a receipt transition
    /// error is mapped to HTTP (spec, Errors > Receipt API: 400 malformed parts, 409 illegal
    /// state transition, including cancel of assigned or consumed).
    pub const fn http_status(&self) -> u16 {
        self.kind().http_status()
    }

    /// The receipt API error kind of the failure.
    pub const fn kind(&self) -> crate::error::ReceiptErrorKind {
        match self {
            TransitionError::Illegal { .. } => crate::error::ReceiptErrorKind::IllegalTransition,
            TransitionError::Parts(_) => crate::error::ReceiptErrorKind::Malformed,
        }
    }

    /// The receipt API error body `{"code":"receipt_error","message":...}`.
    pub fn to_json(&self) -> Vec<u8> {
        receipt_error_json(&self.to_string())
    }
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionError::Illegal { from, event } => {
                write!(f, "cannot {} a receipt in state {from}", event.verb())
            }
            TransitionError::Parts(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TransitionError {}

/// The highest part number accepted. The contract only says "a positive integer"; 10,000 is
/// the part limit of S3 multipart uploads, which the `s3` backend composes with, and it bounds
/// the work of [`check_parts`].
pub const MAX_PART_NUMBER: u32 = 10_000;

/// The number of parts of a part set that was checked to be exactly 1..N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartCount(NonZeroU32);

impl PartCount {
    /// N: the parts are numbered 1 through this.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

/// Why part numbers were refused (400, "malformed metadata or parts").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartsError {
    /// A `{part}` path segment is not a decimal integer without sign or leading zeros.
    NotANumber,
    /// A part number is zero or above [`MAX_PART_NUMBER`].
    OutOfRange(u32),
    /// `complete` found no parts.
    NoParts,
    /// The same part number was listed twice.
    Duplicate(u32),
    /// A part below the highest one is missing.
    Missing {
        /// The lowest missing part number.
        missing: u32,
        /// The highest part number present.
        highest: u32,
    },
}

impl fmt::Display for PartsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PartsError::NotANumber => f.write_str("part number must be a positive integer"),
            PartsError::OutOfRange(n) => {
                write!(f, "part number {n} is outside 1..={MAX_PART_NUMBER}")
            }
            PartsError::NoParts => f.write_str("parts must be exactly 1..N: no parts uploaded"),
            PartsError::Duplicate(n) => {
                write!(f, "parts must be exactly 1..N: part {n} is listed twice")
            }
            PartsError::Missing { missing, highest } => write!(
                f,
                "parts must be exactly 1..N: part {missing} is missing (highest is {highest})"
            ),
        }
    }
}

impl std::error::Error for PartsError {}

/// Parses the `{part}` segment of `PUT /api/v1/receipts/{id}/parts/{part}`: a positive decimal
/// integer (spec, Receipt API) of at most [`MAX_PART_NUMBER`], without sign or leading zeros.
pub fn parse_part_number(segment: &str) -> Result<u32, PartsError> {
    let bytes = segment.as_bytes();
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) || bytes.first() == Some(&b'0') {
        return Err(PartsError::NotANumber);
    }
    let mut n: u32 = 0;
    for &b in bytes {
        // Saturating keeps an absurdly long segment out of range instead of wrapping.
        n = n.saturating_mul(10).saturating_add(u32::from(b - b'0'));
    }
    if n > MAX_PART_NUMBER {
        return Err(PartsError::OutOfRange(n));
    }
    Ok(n)
}

/// Words of the bit set [`check_parts`] keeps on the stack, one bit per possible part number.
const PART_WORDS: usize = MAX_PART_NUMBER as usize / 64 + 1;

/// Checks that `numbers`, the part numbers uploaded so far in any order, are exactly 1..N
/// (spec, Receipt API rule 1: "at completion the uploaded part set must be exactly 1..N").
/// Runs in time linear in the input and allocates nothing.
pub fn check_parts(numbers: &[u32]) -> Result<PartCount, PartsError> {
    let mut seen = [0u64; PART_WORDS];
    let mut highest = 0u32;
    for &n in numbers {
        if n == 0 || n > MAX_PART_NUMBER {
            return Err(PartsError::OutOfRange(n));
        }
        let (word, bit) = ((n / 64) as usize, n % 64);
        let Some(slot) = seen.get_mut(word) else {
            return Err(PartsError::OutOfRange(n));
        };
        if *slot & (1 << bit) != 0 {
            return Err(PartsError::Duplicate(n));
        }
        *slot |= 1 << bit;
        highest = highest.max(n);
    }
    let Some(count) = NonZeroU32::new(highest) else {
        return Err(PartsError::NoParts);
    };
    // With no duplicates and nothing above `highest`, the set is 1..highest exactly when it has
    // `highest` members; otherwise find the lowest gap for the message.
    if numbers.len() == highest as usize {
        return Ok(PartCount(count));
    }
    let missing = (1..highest)
        .find(|&n| {
            seen.get((n / 64) as usize)
                .is_some_and(|w| w & (1 << (n % 64)) == 0)
        })
        .unwrap_or(highest);
    Err(PartsError::Missing { missing, highest })
}

/// The metadata of `POST /api/v1/receipts` (spec, Receipt API), decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewReceipt {
    /// `request` or `response`.
    pub direction: String,
    /// The declared size, at most the configured object size.
    pub size_bytes: u64,
    /// The declared SHA-256, lowercase hex.
    pub sha256_hex: String,
    /// A caller's key making the create idempotent.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Whether `s` is a SHA-256 digest in hex (64 hexadecimal characters, either case).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Decodes a create body (strict JSON, at most [`MAX_RECEIPT_METADATA_BYTES`]) and checks its
/// fields; `max_object_bytes` is `object_storage.max_object_bytes`. The error is the message of
/// the `400` answer.
pub fn decode_new_receipt(bytes: &mut [u8], max_object_bytes: u64) -> Result<NewReceipt, String> {
    let mut r: NewReceipt = crate::json::from_slice_strict(bytes, MAX_RECEIPT_METADATA_BYTES)
        .map_err(|e| format!("malformed receipt metadata: {e}"))?;
    if r.direction != "request" && r.direction != "response" {
        return Err("direction must be request or response".into());
    }
    if !is_sha256_hex(&r.sha256_hex) {
        return Err("sha256_hex must be 64 hexadecimal characters".into());
    }
    if r.size_bytes > max_object_bytes {
        return Err(format!(
            "size_bytes exceeds object_storage.max_object_bytes ({max_object_bytes})"
        ));
    }
    if let Some(k) = &r.idempotency_key {
        if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(format!(
                "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes"
            ));
        }
    }
    r.sha256_hex.make_ascii_lowercase();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReceiptState as S;

    fn parts_ok() -> Result<PartCount, PartsError> {
        check_parts(&[2, 1, 3])
    }

    fn parts_gap() -> Result<PartCount, PartsError> {
        check_parts(&[1, 3])
    }

    /// One event of every kind, with both outcomes of the part check for `Complete`.
    fn all_events() -> Vec<ReceiptEvent> {
        vec![
            ReceiptEvent::UploadPart,
            ReceiptEvent::Complete(parts_ok()),
            ReceiptEvent::Complete(parts_gap()),
            ReceiptEvent::VerificationSucceeded,
            ReceiptEvent::VerificationFailed,
            ReceiptEvent::Assign,
            ReceiptEvent::AssignmentFailed,
            ReceiptEvent::Consume,
            ReceiptEvent::Cancel,
            ReceiptEvent::Expire,
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Want {
        To(ReceiptState, Effect),
        Status(u16),
    }

    /// The full table: every (state, event) pair that does not fail with 409.
    fn expected(from: ReceiptState, event: ReceiptEvent) -> Want {
        use Effect as F;
        use ReceiptEvent as E;
        use Want::*;
        match (from, event) {
            (S::Uploading, E::UploadPart) => To(S::Uploading, F::StorePart),
            (S::Uploading, E::Complete(Ok(_))) => To(S::Verifying, F::ComposeParts),
            (S::Uploading, E::Complete(Err(_))) => Status(400),
            (S::Verified, E::Complete(_)) => To(S::Verified, F::None),
            (S::Verifying, E::VerificationSucceeded) => To(S::Verified, F::None),
            (S::Verifying, E::VerificationFailed) => To(S::Rejected, F::None),
            (S::Verified, E::Assign) => To(S::Assigned, F::None),
            (S::Assigned, E::AssignmentFailed) => To(S::Verified, F::None),
            (S::Assigned, E::Consume) => To(S::Consumed, F::None),
            (S::Uploading, E::Cancel)
            | (S::Verifying, E::Cancel)
            | (S::Verified, E::Cancel)
            | (S::Rejected, E::Cancel)
            | (S::Cancelled, E::Cancel)
            | (S::Expired, E::Cancel) => To(S::Cancelled, F::RemovePayload),
            (S::Uploading, E::Expire)
            | (S::Verifying, E::Expire)
            | (S::Verified, E::Expire)
            | (S::Rejected, E::Expire)
            | (S::Consumed, E::Expire) => To(S::Expired, F::RemovePayload),
            _ => Status(409),
        }
    }

    #[test]
    fn every_state_and_event() {
        let mut legal = 0;
        for from in ReceiptState::ALL {
            for event in all_events() {
                let got = match from.apply(event) {
                    Ok(t) => {
                        assert_eq!(t.from, from);
                        Want::To(t.to, t.effect)
                    }
                    Err(e) => {
                        if e.http_status() == 409 {
                            assert_eq!(
                                e,
                                TransitionError::Illegal {
                                    from,
                                    event: event.kind()
                                }
                            );
                        }
                        Want::Status(e.http_status())
                    }
                };
                assert_eq!(got, expected(from, event), "{from} + {event:?}");
                legal += usize::from(matches!(got, Want::To(..)));
            }
        }
        // 8 states x 10 events: the contract's rows plus the documented decisions.
        assert_eq!(legal, 20);
    }

    #[test]
    fn contract_rows() {
        let t = S::INITIAL
            .apply(ReceiptEvent::Complete(parts_ok()))
            .unwrap();
        assert_eq!((t.to, t.effect), (S::Verifying, Effect::ComposeParts));
        let t = S::Verifying
            .apply(ReceiptEvent::VerificationFailed)
            .unwrap();
        assert_eq!(t.to, S::Rejected);
        // Cancel of assigned or consumed is 409 and leaves the state alone.
        for from in [S::Assigned, S::Consumed] {
            let e = from.apply(ReceiptEvent::Cancel).unwrap_err();
            assert_eq!(e.http_status(), 409);
            assert_eq!(
                e.to_string(),
                format!("cannot cancel a receipt in state {from}")
            );
        }
        // Repeating DELETE is safe.
        let t = S::Cancelled.apply(ReceiptEvent::Cancel).unwrap();
        assert!(t.is_unchanged());
        assert_eq!(t.to, S::Cancelled);
        // Repeating complete on a verified receipt is an idempotent success.
        let t = S::Verified
            .apply(ReceiptEvent::Complete(parts_ok()))
            .unwrap();
        assert!(t.is_unchanged());
        assert_eq!(t.effect, Effect::None);
    }

    #[test]
    fn terminal_states_refuse_assignment_and_completion() {
        for from in ReceiptState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for event in [
                ReceiptEvent::Assign,
                ReceiptEvent::Complete(parts_ok()),
                ReceiptEvent::Complete(parts_gap()),
                ReceiptEvent::UploadPart,
            ] {
                assert_eq!(
                    from.apply(event).map_err(|e| e.http_status()),
                    Err(409),
                    "{from}"
                );
            }
        }
        let terminal: Vec<_> = ReceiptState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(terminal, [S::Rejected, S::Cancelled, S::Expired]);
    }

    #[test]
    fn bad_part_set_is_400_not_a_transition() {
        let e = S::Uploading
            .apply(ReceiptEvent::Complete(parts_gap()))
            .unwrap_err();
        assert_eq!(e.http_status(), 400);
        assert_eq!(
            e.to_string(),
            "parts must be exactly 1..N: part 2 is missing (highest is 3)"
        );
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["code"], "receipt_error");
        assert!(v["message"]
            .as_str()
            .unwrap()
            .starts_with("parts must be exactly 1..N"));
    }

    #[test]
    fn wire_names_round_trip() {
        let names: Vec<&str> = ReceiptState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "uploading",
                "verifying",
                "verified",
                "assigned",
                "consumed",
                "rejected",
                "cancelled",
                "expired"
            ]
        );
        for s in ReceiptState::ALL {
            assert_eq!(ReceiptState::from_wire(s.as_str()), Some(s));
        }
        assert_eq!(ReceiptState::from_wire("Uploading"), None);
        assert_eq!(ReceiptState::from_wire(""), None);
        assert!(S::Uploading.exposes_upload_urls());
        assert!(!S::Verifying.exposes_upload_urls());
        let downloadable: Vec<_> = ReceiptState::ALL
            .into_iter()
            .filter(|s| s.exposes_download_url())
            .collect();
        assert_eq!(downloadable, [S::Verified, S::Consumed]);
    }

    #[test]
    fn part_sets() {
        let table: &[(&[u32], Result<u32, PartsError>)] = &[
            (&[1], Ok(1)),
            (&[1, 2, 3], Ok(3)),
            (&[3, 1, 2], Ok(3)),
            (&[], Err(PartsError::NoParts)),
            (
                &[2],
                Err(PartsError::Missing {
                    missing: 1,
                    highest: 2,
                }),
            ),
            (
                &[1, 3],
                Err(PartsError::Missing {
                    missing: 2,
                    highest: 3,
                }),
            ),
            (
                &[1, 2, 4, 6],
                Err(PartsError::Missing {
                    missing: 3,
                    highest: 6,
                }),
            ),
            (&[1, 1], Err(PartsError::Duplicate(1))),
            (&[1, 2, 2, 3], Err(PartsError::Duplicate(2))),
            (&[0], Err(PartsError::OutOfRange(0))),
            (&[1, 0], Err(PartsError::OutOfRange(0))),
            (
                &[MAX_PART_NUMBER + 1],
                Err(PartsError::OutOfRange(MAX_PART_NUMBER + 1)),
            ),
            (&[u32::MAX], Err(PartsError::OutOfRange(u32::MAX))),
            (
                &[64, 63],
                Err(PartsError::Missing {
                    missing: 1,
                    highest: 64,
                }),
            ),
        ];
        for (numbers, want) in table {
            assert_eq!(
                check_parts(numbers).map(PartCount::get),
                *want,
                "{numbers:?}"
            );
        }
        // The largest allowed set, in reverse order, and one more than it.
        let mut all: Vec<u32> = (1..=MAX_PART_NUMBER).rev().collect();
        assert_eq!(check_parts(&all).map(PartCount::get), Ok(MAX_PART_NUMBER));
        all.retain(|&n| n != 4097);
        assert_eq!(
            check_parts(&all),
            Err(PartsError::Missing {
                missing: 4097,
                highest: MAX_PART_NUMBER
            })
        );
    }

    #[test]
    fn part_numbers() {
        for (s, want) in [
            ("1", Ok(1)),
            ("42", Ok(42)),
            ("10000", Ok(MAX_PART_NUMBER)),
            ("10001", Err(PartsError::OutOfRange(10_001))),
            (
                "99999999999999999999",
                Err(PartsError::OutOfRange(u32::MAX)),
            ),
            ("0", Err(PartsError::NotANumber)),
            ("01", Err(PartsError::NotANumber)),
            ("", Err(PartsError::NotANumber)),
            ("+1", Err(PartsError::NotANumber)),
            ("-1", Err(PartsError::NotANumber)),
            ("1.0", Err(PartsError::NotANumber)),
            (" 1", Err(PartsError::NotANumber)),
            ("١", Err(PartsError::NotANumber)),
        ] {
            assert_eq!(parse_part_number(s), want, "{s:?}");
        }
    }

    #[test]
    fn new_receipt_metadata_is_checked_field_by_field() {
        let sha = "AB".repeat(32);
        let ok = format!(r#"{{"direction":"request","size_bytes":10,"sha256_hex":"{sha}"}}"#);
        let r = decode_new_receipt(&mut ok.into_bytes(), 10).expect("valid");
        assert_eq!(r.sha256_hex, "ab".repeat(32), "lowercased");
        let cases = [
            (
                format!(r#"{{"direction":"up","size_bytes":1,"sha256_hex":"{sha}"}}"#),
                "direction",
            ),
            (
                r#"{"direction":"request","size_bytes":1,"sha256_hex":"zz"}"#.to_string(),
                "sha256_hex",
            ),
            (
                format!(r#"{{"direction":"request","size_bytes":11,"sha256_hex":"{sha}"}}"#),
                "size_bytes",
            ),
            (
                format!(
                    r#"{{"direction":"request","size_bytes":1,"sha256_hex":"{sha}","idempotency_key":""}}"#
                ),
                "idempotency_key",
            ),
            (
                format!(r#"{{"direction":"request","size_bytes":1,"sha256_hex":"{sha}","x":1}}"#),
                "malformed",
            ),
        ];
        for (doc, word) in cases {
            let e = decode_new_receipt(&mut doc.clone().into_bytes(), 10).expect_err(&doc);
            assert!(e.contains(word), "{doc}: {e}");
        }
    }
}
