//! One conversation with the agent under test.
