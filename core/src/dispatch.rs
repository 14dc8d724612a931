//! What becomes of a request after an attempt on a worker ended without an answer (decisions 062
//! and 067): offered to another worker, or failed with the registry's code. Every ingress (the
//! request API, the forward proxy's absolute-form requests and CONNECT tunnels) asks this one
//! rule; the IO layer's dispatch loop only acts on the answer.
//!
//! - A worker that **refused** the assignment (full, draining, or not serving the pool) read
//!   nothing of the request: another worker may be offered it, up to [`MAX_ATTEMPTS`] workers in
//!   all; then `executor_capacity_exhausted`.
//! - A worker **lost** mid-request (its lane closed) may have sent the request upstream. The
//!   request is sent once more, elsewhere, only when the caller allowed it (`is_replayable`), no
//!   response byte came back, no worker had refused it before, and its body is still whole in
//!   memory (a streamed body was consumed; a held receipt stays with the lost attempt until it is
//!   released). Otherwise `worker_disconnected`.
//! - Any other failure is the request's answer.

use crate::error::{ApiError, ErrorCode};

/// Most workers one request may be offered to: after this many refusals it fails with
/// `executor_capacity_exhausted` (decisions 062 and 067).
pub const MAX_ATTEMPTS: usize = 3;

/// How one attempt on a worker ended without an answer.
#[derive(Debug)]
pub enum Failure {
    /// The worker refused the assignment before reading any of it; the reason is for logs.
    Refused(String),
    /// The worker's lane was lost after it accepted; `has_head` when the response head had
    /// arrived (decision 062).
    Lost {
        /// Whether the response head had reached the control.
        has_head: bool,
    },
    /// A registry error: the request's answer.
    Error(ApiError),
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        Failure::Error(e)
    }
}

/// Where the request's body is when an attempt fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Whole in memory (or absent): it can be sent again.
    Whole,
    /// A request receipt held by the attempt: sent by reference, not again after a loss.
    Held,
    /// The client's stream, read as it was sent: gone once sent.
    Streamed,
}

/// What the rule knows of the attempt that failed.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// The worker of the failed attempt (for the error message).
    pub worker_id: &'a str,
    /// Workers the request was offered to before this one.
    pub failed_before: usize,
    /// Whether the caller allows the request to be sent twice.
    pub is_replayable: bool,
    /// Where the body is.
    pub body: BodyState,
}

/// The rule's answer.
#[derive(Debug)]
pub enum Next {
    /// Route again without the failed worker (and every worker that failed before).
    Another,
    /// The request's answer.
    Fail(ApiError),
}

/// What follows `failure` of `attempt`.
pub fn after_failure(failure: Failure, attempt: &Attempt<'_>) -> Next {
    match failure {
        Failure::Refused(_) if attempt.failed_before + 1 < MAX_ATTEMPTS => Next::Another,
        Failure::Refused(_) => Next::Fail(ApiError::new(
            ErrorCode::ExecutorCapacityExhausted,
            "every eligible worker refused the assignment",
        )),
        Failure::Lost { has_head }
            if attempt.is_replayable
                && !has_head
                && attempt.failed_before == 0
                && attempt.body == BodyState::Whole =>
        {
            Next::Another
        }
        Failure::Lost { .. } => Next::Fail(ApiError::new(
            ErrorCode::WorkerDisconnected,
            format!("worker {} disconnected mid-request", attempt.worker_id),
        )),
        Failure::Error(e) => Next::Fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(failed_before: usize, is_replayable: bool, body: BodyState) -> Attempt<'static> {
        Attempt {
            worker_id: "w1",
            failed_before,
            is_replayable,
            body,
        }
    }

    fn code(n: Next) -> Option<ErrorCode> {
        match n {
            Next::Another => None,
            Next::Fail(e) => Some(e.code),
        }
    }

    fn refused() -> Failure {
        Failure::Refused("full".into())
    }

    #[test]
    fn a_request_is_offered_to_at_most_three_workers() {
        for body in [BodyState::Whole, BodyState::Held, BodyState::Streamed] {
            for is_replayable in [false, true] {
                // The first and the second refusal leave room for another offer...
                assert!(code(after_failure(refused(), &attempt(0, is_replayable, body))).is_none());
                assert!(code(after_failure(refused(), &attempt(1, is_replayable, body))).is_none());
                // ...the third ends it.
                assert_eq!(
                    code(after_failure(refused(), &attempt(2, is_replayable, body))),
                    Some(ErrorCode::ExecutorCapacityExhausted)
                );
            }
        }
    }

    #[test]
    fn a_lost_request_is_resent_once_only_when_nothing_forbids_it() {
        let lost = |has_head| Failure::Lost { has_head };
        // The one case: replayable, no head back, first attempt, body whole.
        assert!(code(after_failure(
            lost(false),
            &attempt(0, true, BodyState::Whole)
        ))
        .is_none());
        let disconnected = Some(ErrorCode::WorkerDisconnected);
        // Each condition alone forbids it.
        assert_eq!(
            code(after_failure(
                lost(false),
                &attempt(0, false, BodyState::Whole)
            )),
            disconnected
        );
        assert_eq!(
            code(after_failure(
                lost(true),
                &attempt(0, true, BodyState::Whole)
            )),
            disconnected
        );
        assert_eq!(
            code(after_failure(
                lost(false),
                &attempt(1, true, BodyState::Whole)
            )),
            disconnected
        );
        assert_eq!(
            code(after_failure(
                lost(false),
                &attempt(0, true, BodyState::Held)
            )),
            disconnected
        );
        assert_eq!(
            code(after_failure(
                lost(false),
                &attempt(0, true, BodyState::Streamed)
            )),
            disconnected
        );
        match after_failure(lost(false), &attempt(0, false, BodyState::Whole)) {
            Next::Fail(e) => assert_eq!(e.message, "worker w1 disconnected mid-request"),
            Next::Another => panic!("resent"),
        }
    }

    #[test]
    fn any_other_failure_is_the_answer() {
        let e = ApiError::new(ErrorCode::UpstreamConnectTimeout, "slow");
        match after_failure(e.into(), &attempt(0, true, BodyState::Whole)) {
            Next::Fail(e) => assert_eq!(e.code, ErrorCode::UpstreamConnectTimeout),
            Next::Another => panic!("an error is not retried"),
        }
    }
}
