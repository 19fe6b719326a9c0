//! The conformance bodies on the embedded log.
crate::conformance_tests!(super::Harness::embedded());
