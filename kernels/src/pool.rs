//! A fixed pool of worker threads for host ops (GEMM, attention), started once. Running a
//! job allocates nothing: the job is borrowed for the call, and workers take task indices
//! from an atomic counter.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

type Job = dyn Fn(usize) + Sync;

struct State {
    /// The job of the current epoch, lifetime erased; valid while `run` waits.
    job: Option<*const Job>,
    epoch: u64,
    /// Workers still inside the current epoch's job.
    active: usize,
}

// SAFETY: the raw job pointer is only dereferenced while `run` keeps the job borrowed.
unsafe impl Send for State {}

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
    next: AtomicUsize,
    tasks: AtomicUsize,
    panicked: AtomicBool,
}

pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: usize,
    /// One job at a time (several host contexts may share the pool).
    serial: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pool {
    /// The process-wide pool: one worker per available CPU besides the caller.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            Pool::new(
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .saturating_sub(1),
            )
        })
    }

    fn new(workers: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                epoch: 0,
                active: 0,
            }),
            start: Condvar::new(),
            done: Condvar::new(),
            next: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        let mut started = 0;
        for i in 0..workers {
            let s = shared.clone();
            if std::thread::Builder::new()
                .name(format!("frt-kernels-{i}"))
                .spawn(move || worker(s))
                .is_ok()
            {
                started += 1;
            }
        }
        Pool {
            shared,
            workers: started,
            serial: Mutex::new(()),
        }
    }

    /// Runs `job(i)` for every `i < tasks`, on the workers and the calling thread; returns
    /// when all have run. A panic in a task is re-raised here.
    pub fn run(&self, tasks: usize, job: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if self.workers == 0 || tasks == 1 {
            (0..tasks).for_each(job);
            return;
        }
        let _one = lock(&self.serial);
        let sh = &self.shared;
        sh.next.store(0, Ordering::SeqCst);
        sh.tasks.store(tasks, Ordering::SeqCst);
        sh.panicked.store(false, Ordering::SeqCst);
        {
            let mut st = lock(&sh.state);
            // SAFETY: erases the borrow's lifetime; we wait below until no worker uses it.
            let erased: *const (dyn Fn(usize) + Sync + '_) = job;
            st.job = Some(unsafe {
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(erased)
            });
            st.epoch += 1;
            st.active = self.workers;
        }
        sh.start.notify_all();
        take_tasks(sh, job);
        let mut st = lock(&sh.state);
        while st.active > 0 {
            st = sh.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.job = None;
        drop(st);
        if sh.panicked.load(Ordering::SeqCst) {
            panic!("a host kernel task panicked");
        }
    }
}

fn take_tasks(sh: &Shared, job: &(dyn Fn(usize) + Sync + '_)) {
    let n = sh.tasks.load(Ordering::SeqCst);
    loop {
        let i = sh.next.fetch_add(1, Ordering::SeqCst);
        if i >= n {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
            sh.panicked.store(true, Ordering::SeqCst);
        }
    }
}

fn worker(sh: Arc<Shared>) {
    let mut seen = 0;
    loop {
        let job = {
            let mut st = lock(&sh.state);
            while st.epoch == seen {
                st = sh.start.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            seen = st.epoch;
            st.job
        };
        if let Some(job) = job {
            // SAFETY: `run` keeps the job alive until `active` drops to zero.
            take_tasks(&sh, unsafe { &*job });
        }
        let mut st = lock(&sh.state);
        st.active -= 1;
        if st.active == 0 {
            sh.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::SeqCst);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::SeqCst) == 1),
                "n = {n}"
            );
        }
    }
}
