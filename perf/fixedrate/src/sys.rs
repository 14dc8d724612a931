//! The one piece of the operating system the standard library lacks: an epoll set with a
//! timed wait of nanosecond resolution.
//!
//! `epoll_pwait2` (Linux 5.11) takes its timeout as a `timespec`, where `epoll_wait` takes whole
//! milliseconds: at 27,000 requests per second the slots are 37 us apart, so a millisecond
//! timeout could not wake the loop for the next one. With the process's timer slack lowered to
//! 1 ns, the wait ends some 5-10 us after its deadline.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// An epoll set whose members report readiness edge-triggered.
#[derive(Debug)]
pub(crate) struct Epoll {
    fd: OwnedFd,
}

/// What a wait returned: up to the capacity given at creation.
pub(crate) struct Events {
    list: Vec<libc::epoll_event>,
    len: usize,
}

/// One readiness report: the member's token and whether it has anything for the reader (data,
/// a close or an error) or room for the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    /// The token the member was added with.
    pub(crate) token: u64,
    /// Input, an orderly close by the peer, or an error is pending.
    pub(crate) is_readable: bool,
    /// The send buffer has room, or an error is pending (which a write then reports).
    pub(crate) is_writable: bool,
}

impl Events {
    /// Room for `capacity` reports per wait.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            list: vec![libc::epoll_event { events: 0, u64: 0 }; capacity.max(1)],
            len: 0,
        }
    }

    /// The reports of the last wait.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.list.iter().take(self.len).map(|raw| {
            // The struct is packed on x86_64, so its fields are copied out, never borrowed.
            let flags = raw.events;
            let token = raw.u64;
            let has = |bit: libc::c_int| flags & (bit as u32) != 0;
            let is_failed = has(libc::EPOLLERR) || has(libc::EPOLLHUP);
            Event {
                token,
                is_readable: is_failed || has(libc::EPOLLIN) || has(libc::EPOLLRDHUP),
                is_writable: is_failed || has(libc::EPOLLOUT),
            }
        })
    }
}

impl Epoll {
    /// A new, empty set.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by the kernel and is owned here alone.
        let epoll = Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        };
        // A kernel older than 5.11 has no epoll_pwait2; saying so now beats failing mid-run.
        epoll
            .wait(&mut Events::with_capacity(1), Duration::ZERO)
            .map_err(|e| io::Error::new(e.kind(), format!("epoll_pwait2 (Linux 5.11+): {e}")))?;
        Ok(epoll)
    }

    /// Adds `source` with `token`, reporting input, closes and room to write, edge-triggered:
    /// a report comes when something changes, so a member whose request is in flight costs
    /// nothing until its answer arrives, and no per-request `epoll_ctl` is needed.
    pub(crate) fn add(&self, source: &impl AsRawFd, token: u64) -> io::Result<()> {
        let flags = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET;
        let mut event = libc::epoll_event {
            events: flags as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open for the duration of the call and `event` is a
        // valid epoll_event the kernel only reads.
        let result = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                source.as_raw_fd(),
                &mut event,
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until a member reports or `timeout` passes, and leaves the reports in `events`.
    /// A wait interrupted by a signal returns no reports rather than an error, since the
    /// caller recomputes its deadline and waits again anyway.
    pub(crate) fn wait(&self, events: &mut Events, timeout: Duration) -> io::Result<()> {
        events.len = 0;
        let timeout = timespec(timeout);
        let capacity = libc::c_int::try_from(events.list.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the list has room for `capacity` events, the timespec lives across the call,
        // and a null signal mask leaves the mask alone.
        let n = unsafe {
            libc::epoll_pwait2(
                self.fd.as_raw_fd(),
                events.list.as_mut_ptr(),
                capacity,
                &timeout,
                std::ptr::null(),
            )
        };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(error);
        }
        events.len = usize::try_from(n).unwrap_or(0).min(events.list.len());
        Ok(())
    }
}

/// A duration as a `timespec`; one too long for it (centuries) becomes the longest it holds.
fn timespec(duration: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(duration.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9, the nanoseconds fit a c_long even where it has 32 bits.
        tv_nsec: duration.subsec_nanos() as libc::c_long,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn timespecs_split_seconds_and_nanoseconds() {
        let cases = [
            (Duration::ZERO, 0, 0),
            (Duration::from_nanos(37_037), 0, 37_037),
            (Duration::from_millis(5_250), 5, 250_000_000),
            (Duration::MAX, libc::time_t::MAX, 999_999_999),
        ];
        for (duration, sec, nsec) in cases {
            let ts = timespec(duration);
            assert_eq!((ts.tv_sec, ts.tv_nsec), (sec, nsec), "{duration:?}");
        }
    }

    #[test]
    fn reports_input_with_its_token() {
        let epoll = Epoll::new().expect("epoll");
        let (mut writer, reader) = UnixStream::pair().expect("socket pair");
        epoll.add(&reader, 7).expect("add");
        let mut events = Events::with_capacity(4);

        // A fresh socket has room to write, which edge-triggering reports once.
        epoll.wait(&mut events, Duration::ZERO).expect("wait");
        let first: Vec<Event> = events.iter().collect();
        assert_eq!(
            first,
            [Event {
                token: 7,
                is_readable: false,
                is_writable: true
            }]
        );
        epoll.wait(&mut events, Duration::ZERO).expect("wait");
        assert_eq!(events.iter().count(), 0, "an edge is reported once");

        writer.write_all(b"x").expect("write");
        epoll.wait(&mut events, Duration::ZERO).expect("wait");
        let second: Vec<Event> = events.iter().collect();
        assert!(
            matches!(
                second.as_slice(),
                [Event {
                    token: 7,
                    is_readable: true,
                    ..
                }]
            ),
            "{second:?}"
        );

        drop(writer);
        epoll.wait(&mut events, Duration::ZERO).expect("wait");
        assert!(events.iter().all(|event| event.is_readable));
        assert_eq!(events.iter().count(), 1, "the close is reported");
    }
}
