#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| msmemscope_fuzz::run("csv", data));
