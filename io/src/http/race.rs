//! Racing two futures on one task: the first to finish wins and the other is dropped (which, for
//! a socket read, cancels the operation).

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

/// Which of two raced futures finished first, with its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Either<A, B> {
    /// The first future.
    Left(A),
    /// The second future.
    Right(B),
}

/// Polls `a` then `b` until one completes. `a` is polled first on every wake-up, so put the
/// future that must win ties (a shutdown or a hard stop) on the left.
pub(crate) async fn race<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(out));
        }
        if let Poll::Ready(out) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(out));
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn first_to_finish_wins_and_left_wins_ties() {
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let r = race(std::future::pending::<()>(), async { 2 }).await;
            assert_eq!(r, Either::Right(2));
            let r = race(async { 1 }, async { 2 }).await;
            assert_eq!(r, Either::Left(1));
            let r = race(
                monoio::time::sleep(Duration::from_secs(60)),
                monoio::time::sleep(Duration::from_millis(1)),
            )
            .await;
            assert_eq!(r, Either::Right(()));
        });
    }
}
