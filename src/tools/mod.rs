//! Tool executors (DESIGN.md section 6): http first.
