//! A response head and the first body bytes written with one vectored write (`writev`), so that
//! body bytes already read from the destination go to the client without first being copied
//! behind the head.
//!
//! The io crate's second module with `unsafe` code (after `fd.rs`): the runtime's vectored
//! write takes a raw `iovec` array, which [`HeadAndBody`] builds over buffers it owns and keeps
//! alive and unmoved for as long as the runtime holds it.

#![allow(unsafe_code)]

use bytes::Bytes;
use monoio::buf::IoVecBuf;

/// Two buffers, written in order by one `writev`.
pub(crate) struct HeadAndBody {
    head: Vec<u8>,
    body: Bytes,
    /// Boxed: the address handed to the runtime must not change when `self` moves.
    iov: Box<[libc::iovec; 2]>,
}

impl HeadAndBody {
    /// `head` then `body`.
    pub(crate) fn new(head: Vec<u8>, body: Bytes) -> HeadAndBody {
        let iov = Box::new([
            libc::iovec {
                iov_base: head.as_ptr().cast_mut().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: body.as_ptr().cast_mut().cast(),
                iov_len: body.len(),
            },
        ]);
        HeadAndBody { head, body, iov }
    }

    /// Bytes of both parts.
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// The parts back, to finish a partial write and to reuse the head's buffer.
    pub(crate) fn into_parts(self) -> (Vec<u8>, Bytes) {
        (self.head, self.body)
    }
}

// SAFETY: both `iovec`s point into heap buffers owned by `self` (the `Vec`'s allocation and the
// `Bytes`' shared storage), which neither move nor change while `self` exists: the fields are
// private and never mutated after `new`, and moving `self` moves only the handles. The array
// itself is boxed, so the pointer returned stays valid and unchanged while the runtime owns the
// value, and it holds exactly `read_iovec_len()` initialised entries.
unsafe impl IoVecBuf for HeadAndBody {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iovecs_cover_both_parts_in_order() {
        let v = HeadAndBody::new(b"head".to_vec(), Bytes::from_static(b"body!"));
        assert_eq!(v.len(), 9);
        assert_eq!(v.read_iovec_len(), 2);
        let iov = &v.iov;
        assert_eq!(iov[0].iov_base as *const u8, v.head.as_ptr());
        assert_eq!(iov[0].iov_len, 4);
        assert_eq!(iov[1].iov_base as *const u8, v.body.as_ptr());
        assert_eq!(iov[1].iov_len, 5);
        let moved = Box::new(v);
        let (head, body) = moved.into_parts();
        assert_eq!((&head[..], &body[..]), (&b"head"[..], &b"body!"[..]));
    }
}
