// GET /api/access?chat=<id> -> {gatewayUrl, token}: a short reader token for one chat,
// only for the user who owns it, signed with the app's own key.
import { mintReaderToken, RequestError } from "@gateway/ai/server";
import { appKey, owns, publicGatewayUrl } from "../../gateway.js";

export async function GET(req) {
  const chat = new URL(req.url).searchParams.get("chat") ?? "";
  if (!/^[\w.:-]{1,200}$/.test(chat)) return new RequestError(400, "invalid_input", "chat is required").response();
  if (!(await owns(chat))) return new RequestError(403, "forbidden", "not your chat").response();
  const token = appKey.secret ? await mintReaderToken({ ...appKey, sessions: [chat], ttlSeconds: 900 }) : null;
  return Response.json({ gatewayUrl: publicGatewayUrl, token });
}
