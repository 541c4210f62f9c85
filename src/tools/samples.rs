//! The sample tools `agentrt dev` serves on loopback (issue 4): placeholder.
