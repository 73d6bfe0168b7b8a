//! A persistent thread pool for fork-join kernels.
//!
//! A small model runs ~300 operations per token, so waking threads through the OS for
//! every operation would cost more than the math. Workers therefore spin on an epoch
//! counter for a short while after each job and only then park on a condition
//! variable; the calling thread always takes part as thread 0.
//!
//! Architecture invariant: `run` returns only after every thread has finished the
//! job, which is what makes lending a borrowed closure to the workers sound.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// A job as workers see it: `f(thread_index, n_threads)`.
type Job = dyn Fn(usize, usize) + Sync;

/// Spin iterations before a waiting thread starts yielding its core: short, because
/// with more runnable threads than cores a pure spinner steals time from the thread it
/// waits for.
const SPIN_ITERS: u32 = 2_000;
/// Total time a worker stays awake (spinning, then yielding) after a job before it
/// parks: long enough to bridge the gaps between the operations of one token.
const AWAKE_FOR: std::time::Duration = std::time::Duration::from_millis(2);

/// Waits until `done()` holds: spin, then yield, never sleep (the caller is mid-job).
#[inline]
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPIN_ITERS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

struct Shared {
    /// Bumped once per job; workers wait for it to change.
    epoch: AtomicUsize,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// The current job, valid while `pending > 0`.
    job: UnsafeCell<Option<*const Job>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread in `run` while no worker reads it (all
// workers finished the previous epoch), and read by workers only after they observe the
// new epoch with Acquire ordering, which happens-after the write.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serialises callers: one job at a time.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` (including the caller); `0` means one per available core.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = if n_threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            n_threads
        };
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|tid| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("pagellm-worker-{tid}"))
                    .spawn(move || worker_loop(&shared, tid, n_threads))
                    .expect("spawning a worker thread")
            })
            .collect();
        Self {
            shared,
            workers,
            n_threads,
            run_lock: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(thread_index, n_threads)` on every thread of the pool, the caller being
    /// thread 0, and returns when all are done. A panic in any thread is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n_threads == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call; we wait for
        // `pending == 0` below before returning, so no worker touches `f` afterwards.
        let job: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Job>(f) };
        unsafe { *s.job.get() = Some(job) };
        s.pending.store(self.n_threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, self.n_threads)));
        wait_until(|| s.pending.load(Ordering::Acquire) == 0);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a worker thread panicked inside a kernel");
        }
    }

    /// Splits `0..n` into one contiguous range per thread and runs `f(range)` on each.
    pub fn for_range(&self, n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        self.run(&|tid, nt| {
            let r = split_range(n, tid, nt);
            if !r.is_empty() {
                f(r)
            }
        });
    }
}

/// Fewest rows [`ThreadPool::rows_mut`] splits across threads: below this, waking the
/// pool costs more than the work (a decode step's few rows stay on the caller).
pub const PAR_ROWS: usize = 16;

impl ThreadPool {
    /// Calls `f(i, row)` for every `row_len`-element row `i` of `out`: one contiguous run
    /// of rows per thread from [`PAR_ROWS`] rows up, all on the caller below. Each row
    /// is handed to exactly one call, so what `f` computes for a row does not depend on
    /// the split.
    pub fn rows_mut<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        assert!(
            row_len > 0 && out.len().is_multiple_of(row_len),
            "{} elements do not split into rows of {row_len}",
            out.len()
        );
        let n = out.len() / row_len;
        if n < PAR_ROWS || self.n_threads == 1 {
            for (i, row) in out.chunks_exact_mut(row_len).enumerate() {
                f(i, row);
            }
            return;
        }
        let p = &SyncPtr(out.as_mut_ptr());
        self.for_range(n, &|r| {
            for i in r {
                // SAFETY: `for_range` hands out disjoint ranges of `0..n`, so row `i` is
                // borrowed by this call alone, and `out` outlives `run`.
                let row = unsafe { std::slice::from_raw_parts_mut(p.0.add(i * row_len), row_len) };
                f(i, row);
            }
        });
    }
}

/// The `tid`-th of `nt` near-equal contiguous parts of `0..n`.
pub fn split_range(n: usize, tid: usize, nt: usize) -> std::ops::Range<usize> {
    let base = n / nt;
    let extra = n % nt;
    let start = tid * base + tid.min(extra);
    let len = base + usize::from(tid < extra);
    start..start + len
}

fn worker_loop(s: &Shared, tid: usize, n_threads: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        let mut since: Option<std::time::Instant> = None;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen || s.shutdown.load(Ordering::Relaxed) {
                break e;
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
                continue;
            }
            let start = *since.get_or_insert_with(std::time::Instant::now);
            if start.elapsed() < AWAKE_FOR {
                std::thread::yield_now();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard =
                if s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
                } else {
                    guard
                };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            spins = 0;
            since = None;
        };
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch;
        // SAFETY: see `impl Sync for Shared`; the job outlives this epoch.
        let job = unsafe { (*s.job.get()).expect("job set before epoch bump") };
        let f = unsafe { &*job };
        if catch_unwind(AssertUnwindSafe(|| f(tid, n_threads))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that may be shared between the threads of one `run`, for kernels whose
/// threads write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
pub struct SyncPtr<T>(pub *mut T);
// SAFETY: users guarantee disjoint writes (documented at each use).
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer. A method (not `.0`) so closures capture the whole `Sync` wrapper.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_each_job_once() {
        let pool = ThreadPool::new(3);
        let hits = AtomicU64::new(0);
        for _ in 0..1000 {
            pool.run(&|tid, nt| {
                assert_eq!(nt, 3);
                hits.fetch_add(1 << (tid * 16), Ordering::Relaxed);
            });
        }
        let h = hits.load(Ordering::Relaxed);
        assert_eq!(
            (h & 0xffff, (h >> 16) & 0xffff, h >> 32),
            (1000, 1000, 1000)
        );
    }

    #[test]
    fn rows_mut_hands_each_row_to_one_call_with_its_index() {
        for threads in 1..4 {
            let pool = ThreadPool::new(threads);
            for n in [0, 1, PAR_ROWS - 1, PAR_ROWS, 3 * PAR_ROWS + 5] {
                let mut out = vec![0u32; n * 3];
                pool.rows_mut(&mut out, 3, &|i, row| {
                    for v in row.iter_mut() {
                        *v += i as u32 + 1;
                    }
                });
                let want: Vec<u32> = (0..n).flat_map(|i| [i as u32 + 1; 3]).collect();
                assert_eq!(out, want, "{threads} threads, {n} rows");
            }
        }
    }

    #[test]
    fn split_range_covers_everything_once() {
        for n in 0..50 {
            for nt in 1..6 {
                let mut next = 0;
                for t in 0..nt {
                    let r = split_range(n, t, nt);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn worker_panic_is_reported_to_caller() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid, _| assert!(tid != 1, "boom"))
        }));
        assert!(r.is_err());
        // The pool stays usable afterwards.
        let n = AtomicUsize::new(0);
        pool.run(&|_, _| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let n = AtomicUsize::new(0);
        pool.run(&|_, _| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }
}
