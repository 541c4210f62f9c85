//! The deciders (DESIGN.md section 6): scripted, openai, webhook.

pub mod openai;
