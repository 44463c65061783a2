// Reader tokens for the browser: short-lived, for the sessions the app's own user owns,
// signed with the app's own key (its id in the JWT header), so no app ever holds a key that
// reads every session on the gateway.
import { SignJWT } from "jose";

export interface ReaderTokenOptions {
  /** The app key's id, as configured on the gateway (`kid:secret` in its app keys). */
  kid: string;
  /** The app key's secret, at least 32 bytes. */
  secret: string | Uint8Array;
  /** The sessions (chats) the user may read. The app decides ownership BEFORE calling this. */
  sessions: string[];
  /** Runs it may read besides those sessions' (rarely needed). */
  runs?: string[];
  /** Lifetime, 1..3600 s (default 900); the gateway refuses app tokens living longer. */
  ttlSeconds?: number;
}

/** An HS256 JWT `{sessions, runs, iat, exp}` with `kid` in its header. */
export async function mintReaderToken(options: ReaderTokenOptions): Promise<string> {
  const ttl = options.ttlSeconds ?? 900;
  if (!Number.isInteger(ttl) || ttl < 1 || ttl > 3600) throw new RangeError("ttlSeconds must be 1..3600");
  if (!options.kid) throw new TypeError("kid is required");
  const secret = typeof options.secret === "string" ? new TextEncoder().encode(options.secret) : options.secret;
  if (secret.byteLength < 32) throw new RangeError("the secret must be at least 32 bytes");
  if (!Array.isArray(options.sessions) || options.sessions.length === 0) {
    throw new TypeError("sessions must name at least one session");
  }
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ sessions: options.sessions, runs: options.runs ?? [] })
    .setProtectedHeader({ alg: "HS256", kid: options.kid, typ: "JWT" })
    .setIssuedAt(now)
    .setExpirationTime(now + ttl)
    .sign(secret);
}
