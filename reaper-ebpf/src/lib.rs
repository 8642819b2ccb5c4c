#![no_std]
// Empty library target: lets aya-build's cargo invocation track this crate's sources.
