//! Leak shapes whose channel is a terminal or a loopback TCP connection.
use std::time::Duration;

use serde_json::{Value, json};

use super::sys::*;

/// A background job left on a terminal: the gateway opens a pty master; its agent starts a
/// helper that makes the pty's slave its controlling terminal and its stdin, stdout and stderr
/// (nothing else), ignores SIGHUP as `nohup` does, and then the agent exits. With `hang_up`,
/// the gateway then closes the master: the helper holds a hung-up slave. Otherwise the gateway
/// keeps the master, as a dashboard's PTY bridge does.
pub(crate) fn leak_pty(truth: &str, hang_up: bool) -> Value {
    // SAFETY: plain pty calls on a fresh master.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `master` is a pty master; ptsname's static buffer is copied at once.
    let slave = unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        std::ffi::CStr::from_ptr(libc::ptsname(master)).to_owned()
    };
    let index: u32 = slave
        .to_str()
        .unwrap()
        .trim_start_matches("/dev/pts/")
        .parse()
        .unwrap();
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let agent = fork_then(move || {
        fork_then(move || {
            // SAFETY: plain syscalls in the helper: SIGHUP ignored, a session of its own, the
            // slave as its controlling terminal and its only fds; its pid goes to the gateway
            // once all that is in place.
            unsafe {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::setsid();
                let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
                assert!(fd >= 0, "open the slave");
                for std_fd in 0..3 {
                    libc::dup2(fd, std_fd);
                }
                send_pid(pwr, libc::getpid() as u32);
                libc::close_range(3, u32::MAX, 0);
                libc::pause();
            }
            0
        });
        0
    });
    let helper = recv_pid(prd);
    wait_for(agent);
    if hang_up {
        // SAFETY: closing the gateway's master: the slave hangs up.
        unsafe { libc::close(master) };
    }
    let result = json!({ "agent": agent, "helper": helper, "index": index });
    write_truth(&format!("{truth}.ready"), &result);
    Hold::leak().wait();
    // SAFETY: ends the helper (it is init's child now, not ours).
    unsafe { libc::kill(helper as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    result
}

/// Loopback TCP as a channel: the gateway listens on 127.0.0.1; its agent starts two helpers
/// and exits. One holds nothing but a TCP connection to the gateway (an MCP server reached over
/// localhost); the other holds nothing but a UDP socket and a netlink socket, which tie it to
/// no process. Both have `/dev/null` as stdin, stdout and stderr.
pub(crate) fn leak_tcp(truth: &str) -> Value {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let addr = listener.local_addr().unwrap();
    // Each helper sends its pid on a pipe of its own.
    let (mut trd, mut twr, mut urd, mut uwr) = (0, 0, 0, 0);
    pipe(&mut trd, &mut twr);
    pipe(&mut urd, &mut uwr);
    // Only stdio on /dev/null and `keep` stay open in a helper.
    let isolate = |keep: &[i32]| {
        // SAFETY: plain syscalls in a helper before it waits.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            for std_fd in 0..3 {
                libc::dup2(null, std_fd);
            }
            for fd in 3..1024 {
                if !keep.contains(&fd) {
                    libc::close(fd);
                }
            }
        }
    };
    let agent = fork_then(move || {
        let tcp = fork_then(move || {
            let stream = std::net::TcpStream::connect(addr).expect("connect to the gateway");
            use std::os::fd::AsRawFd;
            send_pid(twr, std::process::id());
            isolate(&[stream.as_raw_fd()]);
            // SAFETY: waits to be ended.
            unsafe { libc::pause() };
            0
        });
        let other = fork_then(move || {
            use std::os::fd::AsRawFd;
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
            // SAFETY: a netlink socket of its own.
            let netlink = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
            send_pid(uwr, std::process::id());
            isolate(&[udp.as_raw_fd(), netlink]);
            // SAFETY: waits to be ended.
            unsafe { libc::pause() };
            0
        });
        let _ = (tcp, other);
        0
    });
    let (connection, _) = listener.accept().expect("accept the helper");
    let tcp_helper = recv_pid(trd);
    let other = recv_pid(urd);
    wait_for(agent);
    let result = json!({ "agent": agent, "tcp": tcp_helper, "udp": other, "port": addr.port() });
    write_truth(&format!("{truth}.ready"), &result);
    Hold::leak().wait();
    for pid in [tcp_helper, other] {
        // SAFETY: ends the helpers (init's children now).
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    drop(connection);
    std::thread::sleep(Duration::from_millis(200));
    result
}
