//! The deciders (docs/design.md section 6): scripted, openai, webhook.
//!
//! The scripted agent needs no I/O and lives in the engine. This room holds the HTTP deciders
//! the controller calls when the engine asks: the OpenAI-compatible client ([`openai`]), the
//! webhook agent ([`webhook::call_agent`]) and, next to it, the consumer's reconcile hook
//! ([`webhook::call_reconcile_hook`]), which answers what to do with an interrupted run. None
//! writes the record: each returns the answer JSON, or why there is none, as the engine's next
//! input.
//!
//! Files:
//! - `openai`: the chat-completions client (`openai/request`: the wire a conversation is encoded
//!   in; `openai/reply`: parsing a reply into a decision).
//! - `webhook`: the webhook agent and the reconcile hook, one HTTP attempt each.
//! - `exact_json`: an answer read as JSON the API server stores exactly, within bounds.

pub mod exact_json;
pub mod openai;
pub mod webhook;
