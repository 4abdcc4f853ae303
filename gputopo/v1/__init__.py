"""Generated code of the gputopo.v1 wire contract (scripts/gen-proto.sh). Do not edit."""
