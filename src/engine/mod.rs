//! The run state machine (DESIGN.md sections 3-6): pure, synchronous, no I/O, no clock.
