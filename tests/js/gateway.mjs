// Shared by the Node client tests: the gateway's producer API over fetch.
import assert from "node:assert/strict";

// `post(path, body, headers)`: POST JSON with `auth`, assert a 2xx, return the JSON reply.
export function producerPost(base, auth) {
  return async function post(path, body, headers = {}) {
    const response = await fetch(base + path, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...auth, ...headers },
      body: JSON.stringify(body),
    });
    const reply = await response.json();
    assert.ok(response.ok, `POST ${path}: ${response.status} ${JSON.stringify(reply)}`);
    return reply;
  };
}
