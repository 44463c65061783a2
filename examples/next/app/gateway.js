// Server-only settings and the demo's ownership rule, shared by the two routes.
import { randomUUID } from "node:crypto";
import { cookies } from "next/headers";

const env = process.env;
export const gateway = { gatewayUrl: env.GATEWAY_URL ?? "http://127.0.0.1:8000", apiKey: env.GATEWAY_API_KEY };
export const publicGatewayUrl = env.GATEWAY_PUBLIC_URL ?? gateway.gatewayUrl;
export const appKey = { kid: env.GATEWAY_APP_KID, secret: env.GATEWAY_APP_SECRET };
export const model = { words: Number(env.CHAT_WORDS ?? 24), delayMs: Number(env.CHAT_WORD_DELAY_MS ?? 150) };

// A demo: each browser is a user (a random id in an HttpOnly cookie) and a chat belongs
// to the user who opened it first. A real app asks its own sign-in and database.
const owners = new Map();
export async function owns(chatId) {
  const jar = await cookies();
  let user = jar.get("uid")?.value;
  if (!user) {
    user = randomUUID();
    jar.set("uid", user, { httpOnly: true, sameSite: "lax", path: "/" });
  }
  if (!owners.has(chatId)) owners.set(chatId, user);
  return owners.get(chatId) === user;
}
