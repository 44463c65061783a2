// The producer suite again on the Redis bridge (a redis-server this test starts).
import { execFileSync } from "node:child_process";
import { test } from "node:test";

let installed = true;
try {
  execFileSync("redis-server", ["--version"], { stdio: "ignore" });
} catch {
  installed = false;
}

test("the producer suite on the Redis bridge", { skip: !installed && "redis-server is not installed", timeout: 120_000 }, () => {
  // One child process: the suite's module-level setup picks the backend from the env.
  // (without the parent runner's NODE_TEST_CONTEXT, the child runs and reports by itself;
  // execFileSync throws on a failure, with the child's report)
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const report = execFileSync(process.execPath, ["--test", "--test-reporter=spec", "test/producer.test.mjs"], {
    cwd: new URL("..", import.meta.url),
    env: { ...env, PRODUCER_BACKEND: "redis" },
    encoding: "utf8",
  });
  if (!/producer \(redis\)/.test(report) || !/ℹ fail 0/.test(report)) throw new Error(report);
  console.log(report);
});
