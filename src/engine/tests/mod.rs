//! The engine's unit tests: one per behaviour of BEHAVIOURS.md 1-50 the engine decides, named
//! for it, built on a fake controller ([`harness`]).

mod approvals;
mod calls;
mod harness;
mod model;
mod outcomes;
mod properties;
mod records;
mod starting;
mod steps;
mod takeover;
