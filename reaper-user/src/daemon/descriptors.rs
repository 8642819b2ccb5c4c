//! The run's descriptors. Its soft limit is raised to the hard one at start: a run holds the
//! ring, the maps, its outlets and the servers' connections (capped, see [`crate::serve`]),
//! and takes more for each look at a process (its /proc files, a pidfd) and each kill, which
//! must not fail for want of one. The `-- CMD` gateway gets the soft limit back: a program
//! may assume the usual 1024 (`select(2)` cannot watch a descriptor past it).
use std::io;

/// The soft and hard limits the run was started with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Inherited(libc::rlimit);

/// Raises the soft limit on descriptors to the hard one; returns what was inherited.
pub(super) fn raise() -> io::Result<Inherited> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let inherited = Inherited(limit);
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        ..limit
    };
    // SAFETY: a valid rlimit, within the hard limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(inherited)
}

impl Inherited {
    /// Gives a command about to run the limits the run was started with.
    pub(super) fn give_back(self, cmd: &mut tokio::process::Command) {
        let limit = self.0;
        // SAFETY: setrlimit is async-signal-safe, and the closure allocates nothing.
        unsafe {
            cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_soft_limit_is_raised_and_a_command_gets_the_inherited_one_back() {
        let inherited = raise().unwrap();
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit to fill.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, now.rlim_max);
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "ulimit -n"]);
        inherited.give_back(&mut cmd);
        let out = cmd.output().await.unwrap();
        let soft = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert_eq!(soft, inherited.0.rlim_cur.to_string());
    }
}
