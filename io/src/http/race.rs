//! Racing two futures on one task: the first to finish wins and the other is dropped (which, for
//! a socket read, cancels the operation).
//!
//! [`Race`] holds the two futures by value and needs them `Unpin`: callers pin large futures in
//! place with [`std::pin::pin!`] and pass the `Pin<&mut _>`. Taking them by value in an `async
//! fn` instead would store each future twice (once as an argument, once pinned), which for a
//! connection's future doubles the memory of every idle connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

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
pub(crate) fn race<A, B>(a: A, b: B) -> Race<A, B>
where
    A: Future + Unpin,
    B: Future + Unpin,
{
    Race { a, b }
}

/// The future returned by [`race`].
pub(crate) struct Race<A, B> {
    a: A,
    b: B,
}

impl<A, B> Future for Race<A, B>
where
    A: Future + Unpin,
    B: Future + Unpin,
{
    type Output = Either<A::Output, B::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = Pin::new(&mut this.a).poll(cx) {
            return Poll::Ready(Either::Left(out));
        }
        if let Poll::Ready(out) = Pin::new(&mut this.b).poll(cx) {
            return Poll::Ready(Either::Right(out));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::time::Duration;

    #[test]
    fn first_to_finish_wins_and_left_wins_ties() {
        crate::runtime::run_on(crate::runtime::Driver::detect(), async {
            let r = race(std::future::pending::<()>(), std::future::ready(2)).await;
            assert_eq!(r, Either::Right(2));
            let r = race(std::future::ready(1), std::future::ready(2)).await;
            assert_eq!(r, Either::Left(1));
            let long = pin!(monoio::time::sleep(Duration::from_secs(60)));
            let short = pin!(monoio::time::sleep(Duration::from_millis(1)));
            assert_eq!(race(long, short).await, Either::Right(()));
        });
    }
}
