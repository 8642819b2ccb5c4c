//! The other /proc texts the leak inspector reads: cmdline, fd link targets, fdinfo, io,
//! syscall and statm. The first byte picks the parser.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaper_user::parse::{self as facts, Args};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 6 {
        0 => {
            let (args, cut) = Args::from_block(rest, 256);
            assert!(args.len() <= 256);
            assert!(cut || args.iter().map(|a| a.len()).sum::<usize>() <= rest.len());
            assert_eq!(args.iter().count(), args.len());
        }
        1 => {
            let _ = facts::parse_fd_target(rest);
        }
        2 => {
            let _ = facts::parse_fdinfo_end(&text);
        }
        3 => {
            let _ = facts::parse_io(&text);
        }
        4 => {
            let _ = facts::parse_syscall(&text);
        }
        _ => {
            let _ = facts::parse_rss_kib(&text, 4);
        }
    }
});
