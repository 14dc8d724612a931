//! provider_session
