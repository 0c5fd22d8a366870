//! The collector's drain tick (`Collection::run_until`): a Linux timerfd in the runtime's
//! epoll set. A tokio interval of a second sits in its timer wheel's 64 ms level, and the
//! runtime wakes once at that slot and again at the deadline: two wake-ups a second where
//! the timerfd makes one (the agent drains every second for as long as it runs).
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use tokio::io::{Interest, unix::AsyncFd};

pub(crate) struct Ticker(AsyncFd<OwnedFd>);

impl Ticker {
    /// Ticks every `period` from now (the first one `period` from now; 1 ns at least).
    pub(crate) fn new(period: Duration) -> io::Result<Self> {
        // SAFETY: plain system call; the descriptor is owned below.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let period = period.max(Duration::from_nanos(1));
        let every = libc::timespec {
            tv_sec: period.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_nsec: period.subsec_nanos().into(),
        };
        let spec = libc::itimerspec {
            it_interval: every,
            it_value: every,
        };
        // SAFETY: a valid timerfd and itimerspec; the old value is not asked for.
        if unsafe {
            libc::timerfd_settime(fd.as_raw_fd(), 0, &raw const spec, std::ptr::null_mut())
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the OwnedFd keeps the descriptor open until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Self(fd))
    }

    /// Waits for the next tick (ticks missed meanwhile count as one).
    pub(crate) async fn tick(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.0.readable().await?;
            let read = guard.try_io(|fd| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads 8 bytes into a buffer of 8.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            if let Ok(result) = read {
                return result;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_that_were_missed_count_as_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut t = Ticker::new(Duration::from_secs(1)).unwrap();
            t.tick().await.unwrap();
            // Two periods pass unread: one tick reads them all, and none is left (the
            // next is half a period away), where an interval would tick twice more at once.
            std::thread::sleep(Duration::from_millis(2500));
            t.tick().await.unwrap();
            let mut buf = [0u8; 8];
            // SAFETY: reads 8 bytes into a buffer of 8.
            let n = unsafe { libc::read(t.0.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            assert_eq!(n, -1, "a tick left over: {}", u64::from_ne_bytes(buf));
            assert_eq!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN)
            );
        });
    }
}
