//! The kernel's BTF blob: any bytes index or fail; every look-up on what indexed returns.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(btf) = reaper_user::parse::KernelBtf::from_bytes(data.to_vec()) {
        let _ = btf.kernel_offsets();
        let _ = btf.offset("task_struct", "signal.pids");
        let _ = btf.enum_value("pid_type", "PIDTYPE_SID");
        let _ = btf.has_btf_tracepoint("sched_process_fork");
    }
});
