"""Stream bridges: the contract (`base`), the rules both backends share (`rules`: cursor,
gap and input rules, a reader's phases and decisions), the one subscriber loop
(`reader`), the in-process backend (`memory`; the Redis one is `gateway.redis`) and the
provider that picks one."""
