//! Unit tests of `cli.rs`.
use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert!(
        parse_duration("ten")
            .unwrap_err()
            .contains("not a duration")
    );
    assert!(parse_duration("").is_err());
    assert!(parse_duration("-5s").is_err());
}

#[test]
fn a_duration_of_several_pieces_reads_as_humantime_reads_it() {
    let secs = |n| Ok(Duration::from_secs(n));
    assert_eq!(parse_duration("1h30m"), secs(5400));
    assert_eq!(parse_duration(" 1h 30m "), secs(5400));
    assert_eq!(parse_duration("1 5h"), secs(15 * 3600));
    assert_eq!(
        parse_duration("1.5m 500ms"),
        Ok(Duration::from_millis(90_500))
    );
    assert_eq!(parse_duration("999ms 1ms 1s"), secs(2));
    assert_eq!(parse_duration("2 hours 3 min"), secs(7380));
    let bad = parse_duration("1h 30x").unwrap_err();
    assert!(
        bad.contains("`30x`") && bad.contains("unknown time unit"),
        "{bad}"
    );
    assert!(parse_duration("1h30").is_err());
    assert!(parse_duration("5s.3m").is_err());
    assert!(parse_duration("5s,3m").is_err());
}

/// humantime 2.4 panics on these (chronotope/humantime#66): a running total of u64::MAX
/// seconds meets nanoseconds summing to exactly one second. Found by the cli_values fuzz target.
#[test]
fn a_duration_past_the_largest_is_an_error_not_a_panic() {
    for text in [
        "18446744073709551615s 1000000000ns",
        "18446744073709551615s 999999999ns 1ns",
        "18446744073709551615s 1000ms",
        "18446744073709551615s1000000us",
    ] {
        let err = parse_duration(text).unwrap_err();
        assert!(err.contains("too long a duration"), "{text}: {err}");
    }
    assert_eq!(
        parse_duration("18446744073709551615s 999999999ns"),
        Ok(Duration::new(u64::MAX, 999_999_999))
    );
    assert!(parse_duration("18446744073709551616s").is_err());
}

#[test]
fn api_sockets() {
    assert_eq!(parse_api("auto"), Ok(Api::Auto));
    assert_eq!(parse_api("off"), Ok(Api::Off));
    assert_eq!(
        parse_api("/run/x/api.sock"),
        Ok(Api::At("/run/x/api.sock".into()))
    );
    assert!(parse_api("").is_err());
    let cli = Cli::try_parse_from(["reaper-trace", "--gateway-pid", "1"]).unwrap();
    assert_eq!(cli.api, Api::Auto, "served by default");
}

#[test]
fn ring_sizes() {
    assert_eq!(parse_ring_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_ring_size("8M"), Ok(8 << 20));
    assert_eq!(parse_ring_size("4096"), Ok(4096));
    assert!(
        parse_ring_size("3MiB")
            .unwrap_err()
            .contains("power of two")
    );
    assert!(parse_ring_size("1KiB").is_err());
    assert!(
        parse_ring_size("16XB")
            .unwrap_err()
            .contains("unknown unit")
    );
    assert!(parse_ring_size("99999999999999GiB").is_err());
}

#[test]
fn sizes_and_addresses() {
    assert_eq!(parse_rotate_size("100MiB"), Ok(100 << 20));
    assert!(parse_rotate_size("1k").unwrap_err().contains("4KiB"));
    assert!(parse_size("lots").unwrap_err().contains("not a size"));
    assert_eq!(
        parse_listen_addr("127.0.0.1:9464"),
        Ok("127.0.0.1:9464".parse().unwrap())
    );
    assert_eq!(
        parse_listen_addr("[::1]:80"),
        Ok("[::1]:80".parse().unwrap())
    );
    assert_eq!(
        parse_listen_addr("localhost:9464"),
        Ok("127.0.0.1:9464".parse().unwrap())
    );
    assert!(
        parse_listen_addr("9464")
            .unwrap_err()
            .contains("127.0.0.1:9464")
    );
    assert!(
        parse_listen_addr("localhost:http")
            .unwrap_err()
            .contains("port")
    );
    assert!(parse_listen_addr("127.0.0.1:99999").is_err());
    let bad = |args: &[&str]| Cli::try_parse_from(args).unwrap().validate().unwrap_err();
    assert!(bad(&["reaper-trace", "--rotate-size", "1MiB", "--", "true"]).contains("--output"));
    assert!(
        bad(&[
            "reaper-trace",
            "--output",
            "f",
            "--rotate-keep",
            "3",
            "--",
            "true"
        ])
        .contains("--rotate-size")
    );
}

#[test]
fn command_line_shapes() {
    let cli = Cli::try_parse_from(["reaper-trace", "--json", "--", "sh", "-c", "true"]).unwrap();
    assert_eq!(cli.command, vec!["sh", "-c", "true"]);
    assert!(cli.validate().is_ok());
    let cli =
        Cli::try_parse_from(["reaper-trace", "--gateway-pid", "1", "--gateway-pid", "7"]).unwrap();
    assert_eq!(cli.gateway_pid, vec![1, 7]);
    assert!(
        Cli::try_parse_from(["reaper-trace"])
            .unwrap()
            .validate()
            .is_err()
    );
    assert!(Cli::try_parse_from(["reaper-trace", "--gateway-pid", "0"]).is_err());
    assert!(Cli::try_parse_from(["reaper-trace", "--gateway-pid", "x"]).is_err());
    assert!(Cli::try_parse_from(["reaper-trace", "--duration", "soon", "--", "true"]).is_err());
    let bad = |args: &[&str]| {
        let cli = Cli::try_parse_from(args).unwrap();
        cli.validate().unwrap_err()
    };
    assert!(bad(&["reaper-trace", "--check", "--gateway-pid", "1"]).contains("--check"));
    assert!(bad(&["reaper-trace", "--settle", "1s", "--", "true"]).contains("--settle"));
    assert!(bad(&["reaper-trace", "--scan-interval", "1ms", "--", "true"]).contains("100ms"));
    let cli = Cli::try_parse_from(["reaper-trace", "--check", "--", "true"]).unwrap();
    assert!(cli.validate().is_ok());
    assert_eq!(cli.settle_time(), Duration::from_secs(2));
    assert!(bad(&["reaper-trace", "--dry-run", "--", "true"]).contains("--kill"));
    let cli = Cli::try_parse_from(["reaper-trace", "--kill", "--", "true"]).unwrap();
    assert_eq!(cli.kill_reasons.0, [Reason::Orphaned, Reason::Deaf]);
    assert!(cli.validate().is_ok());
    let err = Cli::try_parse_from(["reaper-trace", "--kill", "--kill-reasons", "zombie"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot be killed"), "{err}");
    assert!(
        parse_kill_reasons("idle,bogus")
            .unwrap_err()
            .contains("bogus")
    );
    assert_eq!(parse_kill_reasons("idle").unwrap().0, [Reason::Idle]);
}

#[test]
fn state_options() {
    let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.validate());
    assert_eq!(
        parse(&["reaper-trace", "--release-state", "/s"]).unwrap(),
        Ok(())
    );
    let err = parse(&[
        "reaper-trace",
        "--release-state",
        "/s",
        "--gateway-pid",
        "7",
    ])
    .unwrap();
    assert!(err.unwrap_err().contains("traces nothing"));
    assert!(
        parse(&["reaper-trace", "--release-state", "/s", "--state-dir", "/s"]).is_err(),
        "one or the other"
    );
    let ok = parse(&["reaper-trace", "--gateway-pid", "7", "--state-dir", "/s"]).unwrap();
    assert_eq!(ok, Ok(()));
    let err = parse(&["reaper-trace", "--state-dir", "/s", "--", "sh"]).unwrap();
    assert!(
        err.unwrap_err()
            .contains("a `-- CMD` run ends with its command")
    );
}
