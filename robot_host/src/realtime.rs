//! Real-time settings of the control thread (`control.cpu`, `control.realtime`): CPU pinning,
//! SCHED_FIFO and locked memory, each applied when the system permits it. What could not be
//! applied is reported, never fatal: a development machine without the privileges still runs.

/// SCHED_FIFO priority of the control thread (above ordinary threads, below the kernel's
/// own real-time threads).
pub const FIFO_PRIORITY: i32 = 80;

/// Applies the settings to the calling thread; returns each setting's outcome (`Ok`: what was
/// applied, `Err`: what could not be and why).
pub fn apply(cpu: Option<usize>, realtime: bool) -> Vec<Result<String, String>> {
    let mut report = Vec::new();
    #[cfg(target_os = "linux")]
    {
        if let Some(c) = cpu.filter(|c| *c >= libc::CPU_SETSIZE as usize) {
            report.push(Err(format!(
                "could not pin to CPU {c}: beyond the {} CPUs a CPU set holds",
                libc::CPU_SETSIZE
            )));
        } else if let Some(c) = cpu {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; the call only reads it.
            let r = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(c, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            report.push(if r == 0 {
                Ok(format!("pinned to CPU {c}"))
            } else {
                Err(format!(
                    "could not pin to CPU {c}: {}",
                    std::io::Error::last_os_error()
                ))
            });
        }
        if realtime {
            let param = libc::sched_param {
                sched_priority: FIFO_PRIORITY,
            };
            // SAFETY: plain system calls on the calling thread with valid arguments.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            report.push(if r == 0 {
                Ok(format!("SCHED_FIFO priority {FIFO_PRIORITY}"))
            } else {
                Err(format!(
                    "SCHED_FIFO not permitted: {}",
                    std::io::Error::last_os_error()
                ))
            });
            // SAFETY: as above.
            let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
            report.push(if r == 0 {
                Ok("memory locked (mlockall)".to_string())
            } else {
                Err(format!(
                    "mlockall not permitted: {}",
                    std::io::Error::last_os_error()
                ))
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    if cpu.is_some() || realtime {
        report.push(Err(
            "CPU pinning and real-time scheduling are only applied on Linux".into(),
        ));
    }
    report
}

/// What [`apply`] would do on this machine, without changing the calling thread: whether the
/// CPU exists and whether SCHED_FIFO and mlockall would be permitted (the `check` command).
pub fn dry_run(cpu: Option<usize>, realtime: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = cpu {
        let n = std::thread::available_parallelism().map_or(0, |n| n.get());
        out.push(format!(
            "control thread pinned to CPU {c} ({n} CPUs available to this process)"
        ));
    }
    #[cfg(target_os = "linux")]
    if realtime {
        // SAFETY: plain reads of the process's limits and user.
        let (rt, root) = unsafe {
            let mut l: libc::rlimit = std::mem::zeroed();
            let ok = libc::getrlimit(libc::RLIMIT_RTPRIO, &mut l) == 0;
            (ok.then_some(l.rlim_cur), libc::geteuid() == 0)
        };
        let fifo = root || rt.is_some_and(|r| r >= FIFO_PRIORITY as libc::rlim_t);
        out.push(if fifo {
            format!("SCHED_FIFO priority {FIFO_PRIORITY} permitted")
        } else {
            format!(
                "SCHED_FIFO priority {FIFO_PRIORITY} NOT permitted (RLIMIT_RTPRIO {rt:?}, not root): the loop will run unprioritized"
            )
        });
    }
    #[cfg(not(target_os = "linux"))]
    if realtime {
        out.push("real-time scheduling is only applied on Linux".into());
    }
    out
}
