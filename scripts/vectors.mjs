#!/usr/bin/env node
// vectors.mjs replays the test vectors of testdata/vectors.json against a
// Redis server, as a client written from PROTOCOL.md alone would: it loads
// the scripts of internal/lua/ byte for byte, composes every key and argument of the
// store scenario's calls by the rules of PROTOCOL.md, sends them with
// EVALSHA, decodes the replies as PROTOCOL.md says, and compares calls,
// replies, decisions and every key afterwards with the vectors. It also
// checks the vectors a client needs to compose and decode those calls
// (scripts, the function library, owners, keys, scores, turn tokens,
// sequences, stored bytes, continuations), and that the server loads the
// library it composes under the name the vectors give.
//
// Usage: scripts/redis-env.sh node scripts/vectors.mjs
//
// The server is CONTSTORE_REDIS_ADDR (host:port), a standalone Redis 7.
// The check writes only keys of a namespace of its own, drawn at random,
// and deletes them when it ends. Without CONTSTORE_REDIS_ADDR it skips the
// replay (and says so), unless CI is true: then it fails. It needs Node 20
// and nothing else: it speaks RESP itself.
//
// Exit status: 0 when everything matches, 1 on the first mismatch (the
// message names the case), 2 when it cannot run. VECTORS_DEBUG=1 prints
// each step with the server clock it ran at.

import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const CI = /^(1|t|true)$/i.test((process.env.CI ?? '').trim());
const WATCHDOG_MS = 28_000;
// JUMP_MS: a gap of the scenario longer than this is jumped, not waited out.
const JUMP_MS = 10_000;

// ---- failures -------------------------------------------------------------

class Mismatch extends Error {}
// Timing: the replay fell behind the scenario's deadlines (a loaded
// machine); the scenario is replayed once more in a fresh namespace.
class Timing extends Error {}
// Setup: the check cannot run (no server, a namespace in use).
class Setup extends Error {}

function mismatch(where, what) {
  throw new Mismatch(`${where}: ${what}`);
}

const show = (v) => JSON.stringify(v, (_, x) => {
  if (typeof x === 'bigint') return x.toString();
  if (x && x.type === 'Buffer' && Array.isArray(x.data)) return { hex: Buffer.from(x.data).toString('hex') };
  return x;
});

function same(a, b) {
  if (Buffer.isBuffer(a) || Buffer.isBuffer(b)) return Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b);
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort(), kb = Object.keys(b).sort();
    return same(ka, kb) && ka.every((k) => same(a[k], b[k]));
  }
  return a === b;
}

function expectSame(where, what, got, want) {
  if (!same(got, want)) mismatch(where, `${what}: got ${show(got)}, want ${show(want)}`);
}

// ---- RESP (Redis serialization protocol, version 2) -------------------------

// A reply is a Buffer (bulk string), null (nil), a number or bigint
// (integer), a string (status), an array, or {error: text}.
function parseReply(buf, i) {
  const eol = buf.indexOf('\r\n', i);
  if (eol < 0) return null;
  const line = buf.toString('latin1', i + 1, eol);
  const next = eol + 2;
  switch (String.fromCharCode(buf[i])) {
    case '+': return { value: line, end: next };
    case '-': return { value: { error: Buffer.from(line, 'latin1').toString() }, end: next };
    case ':': {
      const n = BigInt(line);
      return { value: n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n, end: next };
    }
    case '$': {
      const len = Number(line);
      if (len < 0) return { value: null, end: next };
      if (buf.length < next + len + 2) return null;
      return { value: Buffer.from(buf.subarray(next, next + len)), end: next + len + 2 };
    }
    case '*': {
      const len = Number(line);
      if (len < 0) return { value: null, end: next };
      const out = [];
      let at = next;
      for (let k = 0; k < len; k++) {
        const r = parseReply(buf, at);
        if (!r) return null;
        out.push(r.value);
        at = r.end;
      }
      return { value: out, end: at };
    }
    default:
      throw new Error(`unexpected RESP type byte 0x${buf[i].toString(16)}`);
  }
}

class Redis {
  static connect(addr) {
    const at = addr.lastIndexOf(':');
    const host = addr.slice(0, at).replace(/^\[|\]$/g, ''), port = Number(addr.slice(at + 1));
    return new Promise((resolve, reject) => {
      const sock = net.createConnection({ host, port });
      sock.setTimeout(5000, () => sock.destroy(new Error(`no answer from ${addr} within 5 s`)));
      sock.once('error', reject);
      sock.once('connect', () => {
        sock.off('error', reject);
        resolve(new Redis(sock, addr));
      });
    });
  }

  constructor(sock, addr) {
    this.sock = sock;
    this.addr = addr;
    this.buf = Buffer.alloc(0);
    this.pending = [];
    sock.setNoDelay(true);
    sock.on('data', (d) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      for (;;) {
        if (!this.pending.length) break;
        const r = parseReply(this.buf, 0);
        if (!r) break;
        this.buf = this.buf.subarray(r.end);
        this.pending.shift().resolve(r.value);
      }
    });
    const fail = (err) => {
      for (const p of this.pending.splice(0)) p.reject(err);
      this.dead = err;
    };
    sock.on('error', fail);
    sock.on('close', () => fail(new Error(`connection to ${addr} closed`)));
  }

  // call sends one command; every argument is a Buffer or a string (sent
  // as its UTF-8 bytes).
  call(...args) {
    if (this.dead) return Promise.reject(this.dead);
    const parts = [Buffer.from(`*${args.length}\r\n`)];
    for (const a of args) {
      const b = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
      parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
    }
    return new Promise((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.sock.write(Buffer.concat(parts));
    });
  }

  // ok is call, failing on an error reply.
  async ok(...args) {
    const r = await this.call(...args);
    if (r && r.error !== undefined) throw new Error(`${args[0]}: ${r.error}`);
    return r;
  }

  close() { this.sock.end(); }
}

// ---- protocol: numbers and hashes (PROTOCOL.md 1, 2.2, 2.3, 7) -------------

const M64 = (1n << 64n) - 1n;
const SCORE_EPOCH_MS = 1735689600000; // 2025-01-01T00:00:00Z
const TURN_EPOCH_S = 1735689600;

// xxhash64 is XXH64 with seed 0 (PROTOCOL.md 1), as a bigint.
function xxhash64(bytes) {
  const P1 = 11400714785074694791n, P2 = 14029467366897019727n, P3 = 1609587929392839161n;
  const P4 = 9650029242287828579n, P5 = 2870177450012600261n;
  const rotl = (x, r) => ((x << BigInt(r)) | (x >> BigInt(64 - r))) & M64;
  const round = (acc, v) => (rotl((acc + v * P2) & M64, 31) * P1) & M64;
  const merge = (acc, v) => (((acc ^ round(0n, v)) * P1) + P4) & M64;
  const u64 = (i) => bytes.readBigUInt64LE(i);
  const n = bytes.length;
  let i = 0, h;
  if (n >= 32) {
    let v1 = (P1 + P2) & M64, v2 = P2, v3 = 0n, v4 = (M64 + 1n - P1) & M64;
    for (; i + 32 <= n; i += 32) {
      v1 = round(v1, u64(i)); v2 = round(v2, u64(i + 8)); v3 = round(v3, u64(i + 16)); v4 = round(v4, u64(i + 24));
    }
    h = (rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18)) & M64;
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = P5;
  }
  h = (h + BigInt(n)) & M64;
  for (; i + 8 <= n; i += 8) h = ((rotl(h ^ round(0n, u64(i)), 27) * P1) + P4) & M64;
  if (i + 4 <= n) {
    h = ((rotl(h ^ ((BigInt(bytes.readUInt32LE(i)) * P1) & M64), 23) * P2) + P3) & M64;
    i += 4;
  }
  for (; i < n; i++) h = (rotl(h ^ ((BigInt(bytes[i]) * P5) & M64), 11) * P1) & M64;
  h ^= h >> 33n; h = (h * P2) & M64; h ^= h >> 29n; h = (h * P3) & M64; h ^= h >> 32n;
  return h;
}

const hex16 = (x) => x.toString(16).padStart(16, '0');
const signed64 = (x) => (x >= 1n << 63n ? x - (1n << 64n) : x);
const utf8 = (s) => Buffer.from(s, 'utf8');

// validId is PROTOCOL.md 2.1 for a session or agent id given as bytes.
function validId(b) {
  if (b.length === 0 || b.length > 256) return false;
  let s;
  try { s = new TextDecoder('utf-8', { fatal: true }).decode(b); } catch { return false; }
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (c <= 0x1f || (c >= 0x7f && c <= 0x9f)) return false;
  }
  return true;
}

const escapeId = (id) => id.replace(/%/g, '%25').replace(/:/g, '%3A');

// ownerKey is PROTOCOL.md 2.2.
const ownerKey = (session, agent) => (agent === undefined ? `m:${escapeId(session)}` : `a:${escapeId(session)}:${escapeId(agent)}`);

// parseOwnerKey is the inverse of ownerKey, or null for a key it never gives.
function parseOwnerKey(key) {
  const part = (s) => {
    if (s.includes(':') || /%(?!25|3A)/.test(s)) return null;
    const id = s.replace(/%3A|%25/g, (m) => (m === '%3A' ? ':' : '%'));
    return validId(utf8(id)) ? id : null;
  };
  if (key.startsWith('m:')) {
    const s = part(key.slice(2));
    return s === null ? null : { session: s };
  }
  if (key.startsWith('a:')) {
    const rest = key.slice(2), at = rest.indexOf(':');
    if (at < 0) return null;
    const s = part(rest.slice(0, at)), a = part(rest.slice(at + 1));
    return s === null || a === null ? null : { session: s, agent: a };
  }
  return null;
}

const partitionOf = (owner, P) => Number(xxhash64(utf8(owner)) % BigInt(P));

// keys is PROTOCOL.md 6.1 for one namespace.
function keys(ns) {
  const tag = (p) => `{${ns}:${String(p).padStart(2, '0')}}`;
  return {
    tag,
    meta: `${ns}:{${ns}}:meta`,
    state: (p, owner) => `${ns}:${tag(p)}:o:${owner}`,
    ownerPrefix: (p) => `${ns}:${tag(p)}:o:`,
    answerPrefix: (p, owner) => `${ns}:${tag(p)}:q:${owner}:`,
    answer: (p, owner, op) => `${ns}:${tag(p)}:q:${owner}:${op.toString('hex')}`,
    lru: (p) => `${ns}:${tag(p)}:lru`,
    part: (p) => `${ns}:${tag(p)}:part`,
  };
}

// estimate is PROTOCOL.md 7.3 without the continuation.
const estimate = (stateKey, owner) => 267 + Math.floor((utf8(stateKey).length + utf8(owner).length) * 115 / 100);

// score packs and unpacks PROTOCOL.md 7.1.
const packScore = (touchedMs, published, size) => (touchedMs - SCORE_EPOCH_MS) * 8192 + (published ? 4096 : 0) + Math.min(size, 4095);
function unpackScore(score) {
  const low = score % 8192;
  return { touchedMs: Math.floor(score / 8192) + SCORE_EPOCH_MS, published: low >= 4096, size: low % 4096 };
}

// turnOf is PROTOCOL.md 7.2: the token of a sequence number.
const turnOf = (seq, P, p) => BigInt(seq) * BigInt(P) + BigInt(p);
// seqArg is the sequence number record and abort send for a token (8.2).
function seqArg(turn, P, p) {
  const t = BigInt(turn);
  return t % BigInt(P) === BigInt(p) ? (t / BigInt(P)).toString() : '0';
}

// rfc3339 formats ms since the Unix epoch as RFC 3339 in UTC, the fraction
// without trailing zeros (PROTOCOL.md 12).
const rfc3339 = (ms) => new Date(ms).toISOString().replace(/\.(\d*?)0*Z$/, (_, f) => (f ? `.${f}Z` : 'Z'));

// ---- protocol: continuations (PROTOCOL.md 6.2) -------------------------------

function putUvarint(out, x) {
  let v = BigInt(x);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
}

function readUvarint(b, at) {
  let v = 0n;
  for (let k = 0; k < 10; k++) {
    if (at + k >= b.length) return null; // truncated
    const c = b[at + k];
    if (k === 9 && c > 1) return null; // above 2^64 - 1
    v |= BigInt(c & 0x7f) << BigInt(7 * k);
    if (c < 0x80) return { v, at: at + k + 1 };
  }
  return null; // longer than 10 bytes
}

const be64 = (x) => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt.asUintN(64, BigInt(x))); return b; };

// encodeContinuation: c has responseId, any, replicaDigest (bigint),
// socket (bigint), items, bytes, digest, signature, references [{item, mask}].
function encodeContinuation(c) {
  let format = 3, id = utf8(c.responseId);
  const m = /^resp_((?:[0-9a-f]{2})+)$/.exec(c.responseId);
  if (m) { format = 4; id = Buffer.from(m[1], 'hex'); }
  const out = [format];
  putUvarint(out, c.items);
  putUvarint(out, c.bytes);
  out.push(...be64(c.digest), ...be64(c.signature));
  const socket = c.any ? 0n : BigInt(c.socket);
  putUvarint(out, socket);
  putUvarint(out, id.length);
  out.push(...id);
  if (socket !== 0n) {
    out.push(...be64(c.replicaDigest));
  } else {
    for (const r of c.references ?? []) {
      const ref = [];
      putUvarint(ref, BigInt(c.items) - BigInt(r.item));
      ref.push(...be64(r.mask));
      if (out.length + ref.length > 64) break;
      out.push(...ref);
    }
  }
  return Buffer.from(out);
}

// decodeContinuation returns the fields of c, or null when a decoder must
// refuse it. replica is the origin's replica reference ("" for any socket).
function decodeContinuation(b) {
  if (!b.length || b[0] < 1 || b[0] > 4) return null;
  const format = b[0];
  let at = 1;
  const sizes = [];
  for (let k = 0; k < 2; k++) {
    const r = readUvarint(b, at);
    if (!r || r.v > 1n << 62n) return null;
    sizes.push(r.v);
    at = r.at;
  }
  if (b.length - at < 16) return null;
  const digest = b.readBigUInt64BE(at), signature = b.readBigUInt64BE(at + 8);
  at += 16;
  const sock = readUvarint(b, at);
  if (!sock) return null;
  at = sock.at;
  const len = readUvarint(b, at);
  if (!len || len.v === 0n || len.v > BigInt(b.length - len.at)) return null;
  at = len.at;
  const field = b.subarray(at, at + Number(len.v));
  at += Number(len.v);
  const rest = b.subarray(at);
  const c = {
    format, items: Number(sizes[0]), bytes: Number(sizes[1]), digest, signature,
    responseId: format === 2 || format === 4 ? `resp_${field.toString('hex')}` : field.toString('utf8'),
    socket: sock.v, any: sock.v === 0n, replica: '', references: [],
  };
  if (c.any) {
    if (format <= 2) return c; // formats 1 and 2: nothing after the id counts
    let k = 0;
    while (k < rest.length) {
      const back = readUvarint(rest, k);
      if (!back || back.v === 0n || back.v > sizes[0] || rest.length - back.at < 8) return null;
      const item = Number(sizes[0] - back.v);
      if (c.references.length && item <= c.references.at(-1).item) return null;
      c.references.push({ item, mask: rest.readBigUInt64BE(back.at) });
      k = back.at + 8;
    }
    return c;
  }
  if (format <= 2) {
    c.replicaDigest = xxhash64(rest);
  } else {
    if (rest.length !== 8) return null;
    c.replicaDigest = rest.readBigUInt64BE(0);
  }
  c.replica = `#${hex16(c.replicaDigest)}`;
  return c;
}

// ---- protocol: ops and deadlines (PROTOCOL.md 6.6) --------------------------

// deadlineOf reads an op's deadline near a time, both in ms since 2025-01-01.
function deadlineOf(op, near) {
  const low = op.readUInt32BE(5);
  let diff = (((low - near) % 2 ** 32) + 2 ** 32) % 2 ** 32;
  if (diff > 3_600_000) diff -= 2 ** 32;
  return near + diff;
}

// makeOp is an op: its 5 random bytes, then the low 32 bits of its deadline.
function makeOp(id, deadline) {
  const op = Buffer.alloc(9);
  id.copy(op, 0, 0, 5);
  op.writeUInt32BE(((deadline % 2 ** 32) + 2 ** 32) % 2 ** 32, 5);
  return op;
}

// ---- the scripts (PROTOCOL.md 8.1, 8.2) ---------------------------------------

// SCRIPTS is the table of PROTOCOL.md 8.2: each script's KEYS and ARGV, by
// role. A trailing '...' marks a variadic tail.
const SCRIPTS = {
  reserve: { keys: ['state', 'answer'], args: ['ttl', 'op', 'estimate', 'limits'] },
  record: { keys: ['state', 'answer'], args: ['ttl', 'op', 'seq', 'continuation', 'estimate', 'limits'] },
  abort: { keys: ['state', 'lru', 'part', 'answer'], args: ['op', 'seq'] },
  clear: { keys: ['state', 'lru', 'part', 'answer'], args: ['op'] },
  inspect: { keys: ['state', 'lru'], args: [] },
  prune: { keys: ['lru', 'part'], args: ['ttl', 'prefix', 'limits'] },
  schema: { keys: ['meta'], args: ['schema', 'partitions', 'profile', 'key'] },
  scan: { keys: ['lru'], args: ['cursor', 'match', 'count'] },
  session_save: { keys: ['head', 'log', 'answer'], args: ['version', 'mode', 'ttl', 'document', 'count', 'op', 'messages...'] },
  session_load: { keys: ['head', 'log'], args: [] },
};

// compose is the source PROTOCOL.md 8.1 sends for a script file: each
// library its "-- uses:" line names, followed by "\n", then the file.
function compose(file) {
  const src = readFileSync(path.join(ROOT, file));
  const uses = /^-- uses: (.*)$/m.exec(src.toString('utf8'));
  if (!uses) throw new Error(`${file}: no "-- uses:" line`);
  const libs = uses[1].trim() === 'none' ? [] : uses[1].split(',').map((s) => `internal/lua/${s.trim()}.lua`);
  const parts = [];
  for (const lib of libs) parts.push(readFileSync(path.join(ROOT, lib)), Buffer.from('\n'));
  parts.push(src);
  return { libs, source: Buffer.concat(parts) };
}

// composeLibrary is the function library PROTOCOL.md 8.1 composes from
// the scripts in the vectors' order: its name and its text.
function composeLibrary(scripts) {
  const shared = [];
  for (const s of scripts) for (const lib of compose(s.file).libs) if (!shared.includes(lib)) shared.push(lib);
  const text = (name) => {
    const parts = [Buffer.from('local KEYS, ARGV\n')];
    for (const lib of shared) parts.push(readFileSync(path.join(ROOT, lib)), Buffer.from('\n'));
    for (const s of scripts) {
      const file = readFileSync(path.join(ROOT, s.file));
      const flags = /^-- flags: (.*)$/m.exec(file.toString('utf8'));
      const quoted = flags ? flags[1].split(',').map((f) => `'${f.trim()}'`).join(', ') : '';
      parts.push(Buffer.from(`redis.register_function{function_name = '${name}_${s.name}', flags = {${quoted}}, callback = function(keys, args)\nKEYS, ARGV = keys, args\n`));
      parts.push(file, Buffer.from('end}\n'));
    }
    return Buffer.concat(parts);
  };
  const digest = createHash('sha1').update(text('contstore_0000000000000000')).digest('hex');
  const name = `contstore_${digest.slice(0, 16)}`;
  return { name, source: Buffer.concat([Buffer.from(`#!lua name=${name}\n`), text(name)]) };
}

// ---- the static vectors ---------------------------------------------------------

const bytesOf = (c, field) => (c[`${field}_hex`] !== undefined ? Buffer.from(c[`${field}_hex`], 'hex') : c[field] === undefined ? undefined : utf8(c[field]));

function checkStatic(v, fpv, counts) {
  for (const s of v.scripts) {
    const where = `scripts: ${s.name}`;
    const want = SCRIPTS[s.name];
    if (!want) mismatch(where, 'a script PROTOCOL.md 8.2 does not list');
    const { libs, source } = compose(s.file);
    expectSame(where, 'libraries', libs, s.libraries);
    expectSame(where, 'composed source length', source.length, s.source_bytes);
    expectSame(where, 'SHA1', createHash('sha1').update(source).digest('hex'), s.sha1);
    const variadic = (want.args.at(-1) ?? '').endsWith('...');
    expectSame(where, 'KEYS count', want.keys.length, s.keys);
    expectSame(where, 'ARGV count', want.args.length - (variadic ? 1 : 0), s.args);
    expectSame(where, 'variadic', variadic, Boolean(s.variadic));
    counts.static++;
  }
  const lib = composeLibrary(v.scripts);
  expectSame('function_library', 'name', lib.name, v.function_library.name);
  expectSame('function_library', 'functions', v.scripts.map((s) => `${lib.name}_${s.name}`), v.function_library.functions);
  expectSame('function_library', 'length', lib.source.length, v.function_library.source_bytes);
  expectSame('function_library', 'SHA1', createHash('sha1').update(lib.source).digest('hex'), v.function_library.sha1);
  counts.static++;
  for (const o of v.owners) {
    const where = `owners: ${o.name}`;
    const s = bytesOf(o, 'session'), a = bytesOf(o, 'agent');
    const valid = validId(s) && (a === undefined || validId(a));
    expectSame(where, 'valid', valid, o.valid);
    if (valid) {
      const key = ownerKey(s.toString('utf8'), a?.toString('utf8'));
      expectSame(where, 'key', key, o.key);
      const h = xxhash64(utf8(key));
      expectSame(where, 'key hash', { hex: hex16(h), dec: signed64(h).toString() }, o.key_hash);
      expectSame(where, 'partition of 16', partitionOf(key, 16), o.partition_16);
      expectSame(where, 'partition of 1024', partitionOf(key, 1024), o.partition_1024);
    }
    counts.static++;
  }
  for (const o of v.owner_keys) {
    const where = `owner_keys: ${JSON.stringify(o.key)}`;
    const got = parseOwnerKey(o.key);
    expectSame(where, 'valid', got !== null, o.valid);
    if (got) expectSame(where, 'ids', got, o.agent === undefined ? { session: o.session } : { session: o.session, agent: o.agent });
    counts.static++;
  }
  for (const k of v.keys) {
    const where = `keys: ${k.namespace} ${k.owner_key}`;
    const p = partitionOf(k.owner_key, k.partitions);
    const ks = keys(k.namespace);
    expectSame(where, 'owner key', ownerKey(k.session, k.agent), k.owner_key);
    expectSame(where, 'names', {
      partition: p, tag: ks.tag(p), state: ks.state(p, k.owner_key), owner_prefix: ks.ownerPrefix(p), lru_member: k.owner_key,
      answer_prefix: ks.answerPrefix(p, k.owner_key), lru: ks.lru(p), part: ks.part(p), meta: ks.meta,
    }, {
      partition: k.partition, tag: k.tag, state: k.state, owner_prefix: k.owner_prefix, lru_member: k.lru_member,
      answer_prefix: k.answer_prefix, lru: k.lru, part: k.part, meta: k.meta,
    });
    counts.static++;
  }
  for (const s of v.scores) {
    const where = `scores: ${s.touched}`;
    expectSame(where, 'score', packScore(s.touched_ms, s.published, s.size), s.score);
    expectSame(where, 'decoded', unpackScore(s.score), { touchedMs: s.touched_ms, published: s.published, size: s.size });
    expectSame(where, 'touched', rfc3339(s.touched_ms), s.touched);
    counts.static++;
  }
  for (const t of v.turn_tokens) {
    expectSame(`turn_tokens: seq ${t.seq} P ${t.partitions} p ${t.partition}`, 'turn', turnOf(t.seq, t.partitions, t.partition).toString(), t.turn);
    expectSame(`turn_tokens: ${t.turn}`, 'seq sent', seqArg(t.turn, t.partitions, t.partition), String(t.seq));
    counts.static++;
  }
  for (const s of v.sequences) {
    const where = `sequences: ${s.name}`;
    const micros = (s.time_s - TURN_EPOCH_S) * 1_000_000 + s.time_us;
    const abs = Math.abs(s.owner_t);
    const seq = Math.max(s.partition_seq + 1, micros, s.owner_t !== 0 ? abs + 1 : 0);
    expectSame(where, 'micros, seq, turn', [micros, seq, turnOf(seq, s.partitions, s.partition).toString()], [s.micros, s.seq, s.turn]);
    counts.static++;
  }
  for (const s of v.stored_bytes) {
    const where = `stored_bytes: ${s.namespace} ${s.session}`;
    const owner = ownerKey(s.session, s.agent);
    const p = partitionOf(owner, s.partitions);
    const state = keys(s.namespace).state(p, owner);
    const c = encodeContinuation({
      responseId: s.response_id, socket: BigInt(s.origin_socket), any: s.origin_socket === '0',
      replicaDigest: xxhash64(utf8(s.origin_replica)), items: s.items, bytes: s.transcript_bytes, digest: 0n, signature: 0n,
    });
    const without = estimate(state, owner);
    expectSame(where, 'sizes', [p, utf8(state).length, utf8(owner).length, c.length, without, without + c.length, Math.min(without + c.length, 4095)],
      [s.partition, s.state_key_bytes, s.member_bytes, s.continuation_bytes, s.without_continuation, s.with_continuation, s.score_size]);
    counts.static++;
  }
  for (const c of v.continuations) {
    const where = `continuations: ${c.name}`;
    const b = Buffer.from(c.hex, 'hex');
    const got = decodeContinuation(b);
    expectSame(where, 'valid', got !== null, c.valid);
    if (got) {
      const d = (x) => ({ hex: hex16(x), dec: signed64(x).toString() });
      expectSame(where, 'decoded', {
        response_id: got.responseId, any_socket: got.any, origin_socket: got.socket.toString(), items: got.items,
        transcript_bytes: got.bytes, digest: d(got.digest), signature: d(got.signature),
        origin_replica_digest: got.any ? undefined : hex16(got.replicaDigest),
        references: got.references.length ? got.references.map((r) => ({ item: r.item, mask: d(r.mask) })) : undefined,
      }, {
        response_id: c.response_id, any_socket: Boolean(c.any_socket), origin_socket: c.origin_socket, items: c.items,
        transcript_bytes: c.transcript_bytes, digest: c.digest, signature: c.signature,
        origin_replica_digest: c.origin_replica_digest, references: c.references,
      });
      if (!got.any) expectSame(where, 'digest of the replica name', hex16(xxhash64(utf8(c.origin_replica))), c.origin_replica_digest);
      if (!c.decode_only) {
        const again = encodeContinuation({
          responseId: c.response_id, any: Boolean(c.any_socket), socket: BigInt(c.origin_socket),
          replicaDigest: xxhash64(utf8(c.origin_replica)), items: c.items, bytes: c.transcript_bytes,
          digest: BigInt(`0x${c.digest.hex}`), signature: BigInt(`0x${c.signature.hex}`),
          references: (c.references ?? []).map((r) => ({ item: r.item, mask: BigInt(`0x${r.mask.hex}`) })),
        });
        expectSame(where, 'encoded', again.toString('hex'), c.hex);
      }
    }
    counts.static++;
  }
  expectSame('constants', 'score epoch', v.constants.score_epoch_ms, SCORE_EPOCH_MS);
  expectSame('constants', 'turn epoch', v.constants.turn_epoch_s, TURN_EPOCH_S);
  expectSame('constants', 'op bytes', v.constants.op_bytes, 9);
  expectSame('constants', 'eviction budget', v.constants.eviction_budget, 64);
  expectSame('fingerprint constants', 'key', typeof fpv.constants.key_hex, 'string');
}

// ---- the scenario ---------------------------------------------------------------

// vectorValue turns a vector's value into a reply's form: a JSON string
// is a bulk string, {hex} opaque bytes, a number an integer, null nil.
function vectorValue(x) {
  if (typeof x === 'string') return utf8(x);
  if (Array.isArray(x)) return x.map(vectorValue);
  if (x && typeof x === 'object' && typeof x.hex === 'string') return Buffer.from(x.hex, 'hex');
  return x;
}

const asString = (b) => (Buffer.isBuffer(b) ? b.toString('utf8') : b);

// reserveReply reads a reply of reserve (PROTOCOL.md 8.3),
// "<seq>:<existed>:<evicted>" then ":" and the continuation it consumed;
// null when it is not one.
function reserveReply(r) {
  if (!Buffer.isBuffer(r)) return null;
  const a = r.indexOf(0x3a);
  const b = a < 0 ? -1 : r.indexOf(0x3a, a + 1);
  if (b < 0) return null;
  const c = r.indexOf(0x3a, b + 1);
  const [seq, existed, evicted] = [r.subarray(0, a), r.subarray(a + 1, b), r.subarray(b + 1, c < 0 ? r.length : c)].map(String);
  if (!/^[1-9][0-9]*$/.test(seq) || !/^[01]$/.test(existed) || !/^[0-9]+$/.test(evicted)) return null;
  return { seq: BigInt(seq), existed: Number(existed), evicted: Number(evicted), continuation: c < 0 ? null : r.subarray(c + 1) };
}
const isExpired = (r) => Array.isArray(r) && r.length === 2 && Buffer.isBuffer(r[0]) && r[0].toString() === 'expired';

// itemsOf returns a request body's items as the raw text of each (without
// surrounding white space), per PROTOCOL.md 4.
function itemsOf(body) {
  let i = 0;
  const ws = () => { while (i < body.length && ' \t\n\r'.includes(body[i])) i++; };
  const skipString = () => {
    for (i++; body[i] !== '"'; i++) if (body[i] === '\\') i++;
    i++;
  };
  const skipValue = () => {
    ws();
    const open = body[i];
    if (open === '"') return skipString();
    if (open === '{' || open === '[') {
      const close = open === '{' ? '}' : ']';
      i++;
      ws();
      if (body[i] === close) { i++; return; }
      for (;;) {
        if (open === '{') { ws(); skipString(); ws(); i++; } // key and ':'
        skipValue();
        ws();
        if (body[i++] === close) return;
      }
    }
    while (i < body.length && !',}] \t\n\r'.includes(body[i])) i++;
  };
  ws();
  i++; // '{'
  ws();
  if (body[i] === '}') return [];
  for (;;) {
    ws();
    const k0 = i;
    skipString();
    const key = JSON.parse(body.slice(k0, i));
    ws();
    i++; // ':'
    ws();
    if (key === 'input') {
      if (body[i] === '"') { const v0 = i; skipString(); return [body.slice(v0, i)]; }
      if (body[i] !== '[') throw new Error('input is neither an array nor a string');
      const out = [];
      i++;
      ws();
      if (body[i] === ']') return out;
      for (;;) {
        ws();
        const v0 = i;
        skipValue();
        out.push(body.slice(v0, i));
        ws();
        if (body[i++] === ']') return out;
      }
    }
    skipValue();
    ws();
    if (body[i++] === '}') return [];
  }
}

// stateOfEntry returns the state key of member, an entry of the LRU lru
// (PROTOCOL.md 6.1: both keys share the partition's prefix).
const stateOfEntry = (lru, member) => lru.slice(0, -'lru'.length) + 'o:' + member.toString();

class Scenario {
  constructor(redis, v, fpv, shas, counts, stretch) {
    this.redis = redis;
    this.stretch = stretch; // how many times longer than the vectors' a call's time to its deadline is
    this.v = v;
    this.fpv = fpv;
    this.shas = shas;
    this.counts = counts;
    const o = v.store_scenario.options;
    this.o = o;
    this.P = o.partitions;
    // The run's own namespace: as long as the vectors' (the stored-bytes
    // estimate counts the key names' bytes), drawn at random.
    const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
    this.ns = Array.from(randomBytes(utf8(o.namespace).length), (b) => alphabet[b % alphabet.length]).join('');
    this.vk = keys(o.namespace);
    this.offset = undefined; // see real
    // The scripts read the server's clock. A gap of the scenario longer
    // than JUMP_MS is not waited out: the run moves its stored times back
    // instead (shift), as if the server's clock had jumped. shifted is the
    // sum of those moves: the run's clock is the server's plus shifted.
    this.unit = Math.max(1, Math.floor(o.ttl_ms / 256)); // a refresh tick (PROTOCOL.md 8.2)
    this.shifted = 0;
    this.last = undefined; // the previous step: {stepMs, at} (at on the run's clock)
    this.touches = []; // {lo, hi, vec}: a step ran from lo to hi on the run's clock, at vec on the scenario's
    this.ops = new Map(); // op hex in the vectors → {real, deadline, realDeadline}
    this.opsBack = new Map(); // real op hex → op hex in the vectors
    this.seqs = new Map(); // "p:real seq" → seq in the vectors (bigint)
    this.seqsOut = new Map(); // "p:seq in the vectors" → real seq (bigint)
    this.sent = new Map(); // step name → the real calls it sent
    this.partial = {};
  }

  pattern() { return `${this.ns}:{${this.ns}[:}]*`; }

  async keysOfRun() {
    const out = [];
    let cursor = '0';
    do {
      const [next, batch] = await this.redis.ok('SCAN', cursor, 'MATCH', this.pattern(), 'COUNT', '1000');
      cursor = next.toString();
      out.push(...batch.map((b) => b.toString('utf8')));
    } while (cursor !== '0');
    return out;
  }

  async cleanup() {
    for (const k of await this.keysOfRun()) await this.redis.ok('DEL', k);
  }

  // serverMs is the server's clock in ms since 2025-01-01.
  async serverMs() {
    const [s, us] = await this.redis.ok('TIME');
    return Number(s) * 1000 + Math.floor(Number(us) / 1000) - SCORE_EPOCH_MS;
  }

  // real is the instant of this run's server clock that stands for an
  // instant of the scenario (both in ms since 2025-01-01): this run goes
  // through the scenario's time stretched by this.stretch, and jumps over
  // the stretches of it where no call is within its deadline (keepTime
  // moves this.offset).
  real(ms) { return ms * this.stretch + this.offset; }

  // keepTime waits, before a step at stepMs, until this run's server clock
  // stands where the scenario's did relative to every op's deadline: past
  // the deadlines the step's time has reached, before the others.
  async keepTime(where, stepMs) {
    const now = await this.serverMs();
    const live = [...this.ops.values()].filter((m) => m.deadline > stepMs);
    let until = now;
    for (const m of this.ops.values()) if (m.deadline <= stepMs) until = Math.max(until, m.realDeadline + 2);
    if (this.offset === undefined || !live.length) this.offset = until - stepMs * this.stretch; // skip ahead
    until = Math.max(until, this.real(stepMs));
    for (let t = now; t < until; t = await this.serverMs()) await new Promise((res) => setTimeout(res, until - t));
    for (const m of live) {
      if (until >= m.realDeadline) throw new Timing(`${where}: the replay cannot keep a deadline (the machine may be loaded)`);
    }
  }

  // shift moves every time the run's keys hold back by ms, as the server's
  // clock jumping ms ahead would age them: LRU scores (and with them each
  // state's refresh tick in o, PROTOCOL.md Appendix B) and TTLs; a key
  // whose TTL runs out goes. Op deadlines are not moved: keepTime waited
  // them out.
  async shift(where, ms) {
    const names = await this.keysOfRun();
    const touched = new Map(); // state key → its LRU entry's new touch (ms since 2025-01-01)
    for (const k of names.filter((n) => n.endsWith('}:lru'))) {
      const c = await this.redis.ok('ZRANGE', k, '0', '-1', 'WITHSCORES');
      for (let i = 0; i < c.length; i += 2) {
        const score = Number(c[i + 1].toString()) - ms * 8192;
        await this.redis.ok('ZADD', k, String(score), c[i]);
        touched.set(stateOfEntry(k, c[i]), Math.floor(score / 8192));
      }
    }
    for (const k of names) {
      const pttl = Number(await this.redis.ok('PTTL', k));
      if (pttl > 0 && pttl <= ms) {
        await this.redis.ok('DEL', k);
        continue;
      }
      if (pttl > 0) await this.redis.ok('PEXPIRE', k, String(pttl - ms));
      const o = k.includes('}:o:') ? await this.redis.ok('HGET', k, 'o') : null;
      if (o) {
        if (!touched.has(k)) mismatch(where, `state ${k} has no LRU entry whose touch its refresh tick could follow`);
        const moved = Buffer.from(o);
        moved[10] = this.tick(touched.get(k));
        await this.redis.ok('HSET', k, 'o', moved);
      }
    }
    this.shifted += ms;
  }

  // tick is the refresh tick of an instant in ms since 2025-01-01.
  tick(ms) { return Math.floor(ms / this.unit) % 256; }

  // touchBack maps a touch stored by this run (ms since 2025-01-01 on the
  // server's clock, as moved by shift) to the vectors': the time of the
  // step during which it was written.
  touchBack(where, stored) {
    const at = stored + this.shifted;
    const t = this.touches.find((x) => x.lo <= at && at <= x.hi);
    if (!t) mismatch(where, `touch ${stored} written outside every step`);
    return t.vec;
  }

  // scoreBack maps an LRU score stored by this run to the vectors': its
  // touch mapped back (touchBack), its size and published bit kept.
  scoreBack(where, score) {
    return this.touchBack(where, Math.floor(score / 8192)) * 8192 + (score % 8192);
  }

  // realOp maps an op of the vectors to the op this run sends: the same
  // id, and the deadline that stands for the vector's (real).
  async realOp(vecOp, stepMs) {
    const hex = vecOp.toString('hex');
    let m = this.ops.get(hex);
    if (!m) {
      const deadline = deadlineOf(vecOp, stepMs);
      const realDeadline = this.real(deadline);
      m = { real: makeOp(vecOp, realDeadline), deadline, realDeadline };
      this.ops.set(hex, m);
      this.opsBack.set(m.real.toString('hex'), hex);
    }
    return m.real;
  }

  // mapSeq records that the server drew real where the vectors drew vec,
  // in partition p; the order of a partition's numbers must agree.
  mapSeq(where, p, real, vec) {
    real = BigInt(real);
    vec = BigInt(vec);
    const known = this.seqs.get(`${p}:${real}`);
    if (known !== undefined) {
      if (known !== vec) mismatch(where, `sequence number ${real} stands for ${known} in the vectors, here for ${vec}`);
      return;
    }
    if (this.seqsOut.has(`${p}:${vec}`)) mismatch(where, `sequence number ${vec} of the vectors was drawn as ${this.seqsOut.get(`${p}:${vec}`)}, now as ${real}`);
    for (const [k, v] of this.seqs) {
      const [kp, kr] = k.split(':');
      if (Number(kp) !== p) continue;
      const r = BigInt(kr);
      if ((r < real) !== (v < vec)) mismatch(where, `sequence numbers out of the vectors' order: ${r} (vectors ${v}) and ${real} (vectors ${vec})`);
    }
    this.seqs.set(`${p}:${real}`, vec);
    this.seqsOut.set(`${p}:${vec}`, real);
  }

  seqBack(where, p, real) {
    const v = this.seqs.get(`${p}:${BigInt(real)}`);
    if (v === undefined) mismatch(where, `sequence number ${real} of partition ${p} was never drawn by a reserve`);
    return v;
  }

  seqOut(where, p, vec) {
    if (vec === '0') return '0';
    const r = this.seqsOut.get(`${p}:${BigInt(vec)}`);
    if (r === undefined) mismatch(where, `sequence number ${vec} of the vectors was never drawn`);
    return r.toString();
  }

  // ---- composing calls from a step's input (PROTOCOL.md 5, 6, 7, 8) ----

  limits(maxOwners) {
    const o = this.o;
    return `${Math.floor((maxOwners ?? o.max_owners) / this.P)}:${Math.floor(o.max_total_bytes / this.P)}:${o.eviction_budget}`;
  }

  // ownerCall composes a call of an owner script in the vectors' namespace.
  ownerCall(script, owner, op, extra) {
    const p = partitionOf(owner, this.P), k = this.vk;
    // 8.2: reserve and record name the partition's clock, LRU and
    // accounting themselves
    const keys = [k.state(p, owner)];
    if (script === 'reserve' || script === 'record') keys.push(k.answer(p, owner, op));
    else keys.push(k.lru(p));
    if (script === 'abort' || script === 'clear') keys.push(k.part(p), k.answer(p, owner, op));
    const args = script === 'reserve' || script === 'record' ? [String(this.o.ttl_ms)] : [];
    if (op) args.push(op);
    return { script, p, owner, keys, args: [...args, ...extra] };
  }

  compose(step) {
    const inp = step.input ?? {};
    const op = inp.op ? Buffer.from(inp.op, 'hex') : undefined;
    const owner = inp.owner;
    const p = owner ? partitionOf(owner, this.P) : undefined;
    const est = owner ? String(estimate(this.vk.state(p, owner), owner)) : undefined;
    switch (step.op) {
      case 'open':
        return [{
          script: 'schema', keys: [this.vk.meta],
          args: [String(this.v.constants.schema_version), String(this.P), this.fpv.constants.profile_id, this.fpv.constants.key_hex],
        }];
      case 'reserve':
        if (inp.sent_again) return null;
        return [this.ownerCall('reserve', owner, op, [est, this.limits(inp.max_owners)])];
      case 'record': {
        // PROTOCOL.md 5.2: a response without id, or on socket 0 of a
        // replica, is dropped: abort with the turn.
        const seq = seqArg(inp.turn, this.P, p);
        if (inp.response_id === '' || (!inp.socket_any && inp.socket_id === '0')) {
          return [this.ownerCall('abort', owner, op, [seq])];
        }
        const vecCall = step.calls[0];
        return [this.ownerCall('record', owner, op, [seq, vectorValue(vecCall.args[3]), est, this.limits()])];
      }
      case 'abort':
        return [this.ownerCall('abort', owner, op, [seqArg(inp.turn, this.P, p)])];
      case 'clear':
        return [this.ownerCall('clear', owner, op, [])];
      case 'inspect':
      case 'is_current':
        return [this.ownerCall('inspect', owner, undefined, [])];
      case 'prune':
        return [{ script: 'prune', p: inp.partition, keys: [this.vk.lru(inp.partition), this.vk.part(inp.partition)],
          args: [String(this.o.ttl_ms), this.vk.ownerPrefix(inp.partition), this.limits()] }];
      default:
        return undefined;
    }
  }

  // toRun turns a composed call of the vectors' namespace into the call
  // this run sends: its namespace, its ops and its sequence numbers.
  async toRun(where, call, stepMs) {
    const roles = SCRIPTS[call.script];
    const swap = (s) => {
      const from = `${this.o.namespace}:{${this.o.namespace}`;
      if (!s.startsWith(from)) mismatch(where, `key ${s} outside the namespace`);
      return `${this.ns}:{${this.ns}${s.slice(from.length)}`;
    };
    const keys = [];
    for (const [i, k] of call.keys.entries()) {
      let name = swap(k);
      if (roles.keys[i] === 'answer') {
        const vecOp = Buffer.from(k.slice(-18), 'hex');
        name = name.slice(0, -18) + (await this.realOp(vecOp, stepMs)).toString('hex');
      }
      keys.push(name);
    }
    const args = [];
    for (const [i, a] of call.args.entries()) {
      const role = roles.args[Math.min(i, roles.args.length - 1)];
      if (role === 'op') args.push(await this.realOp(a, stepMs));
      else if (role === 'seq') args.push(this.seqOut(where, call.p, asString(a)));
      else if (role === 'prefix') args.push(swap(asString(a)));
      else args.push(a);
    }
    return { script: call.script, p: call.p, keys, args };
  }

  async send(where, call) {
    const sha = this.shas[call.script];
    let reply = await this.redis.call('EVALSHA', sha, String(call.keys.length), ...call.keys, ...call.args);
    if (reply && reply.error !== undefined && reply.error.startsWith('NOSCRIPT')) {
      const { source } = compose(`internal/lua/${call.script}.lua`);
      reply = await this.redis.call('EVAL', source, String(call.keys.length), ...call.keys, ...call.args);
    }
    if (reply && reply.error !== undefined) mismatch(where, `${call.script} failed: ${reply.error}`);
    return reply;
  }

  // back turns a reply of this run into the vectors' terms: sequence
  // numbers and server clocks (which must lie within the call).
  back(where, call, reply, want, before, after) {
    const clock = (r, w) => {
      if (typeof r !== 'number' || r < before || r > after) mismatch(where, `server clock ${r} outside the call (${before}..${after})`);
      return typeof w === 'number' ? w : r;
    };
    if (isExpired(reply)) {
      const w = isExpired(want) ? want[1] : undefined;
      return [reply[0], clock(reply[1], w)];
    }
    switch (call.script) {
      case 'reserve': {
        const got = reserveReply(reply);
        const vec = reserveReply(want);
        if (!got || !vec) return reply; // mismatch reported by the comparison
        this.mapSeq(where, call.p, got.seq, vec.seq);
        return Buffer.concat([utf8(String(this.seqBack(where, call.p, got.seq))), reply.subarray(reply.indexOf(0x3a))]);
      }
      case 'inspect': {
        if (!reply.length) return reply;
        const t = reply[1].toString();
        const neg = t.startsWith('-');
        const v = this.seqBack(where, call.p, neg ? t.slice(1) : t);
        let score = reply[0];
        if (score !== null) {
          const n = Number(score.toString());
          score = utf8(String(this.scoreBack(where, n)));
        }
        return [score, utf8(`${neg ? '-' : ''}${v}`), reply[2]];
      }
      case 'schema':
        return [...reply.slice(0, 4), clock(reply[4], Array.isArray(want) ? want[4] : undefined)];
      default:
        return reply;
    }
  }

  // decide derives a step's result from its replies (already in the
  // vectors' terms), per PROTOCOL.md 5 and 8.3.
  decide(step, calls, replies) {
    const inp = step.input ?? {};
    const r = replies[0];
    const where = `store_scenario: ${step.name}`;
    switch (step.op) {
      case 'open': {
        const own = calls[0].args.slice(0, 3).map(asString);
        const got = r.slice(0, 3).map((x) => (x === null ? null : x.toString()));
        return { schema_ok: same(own, got) && /^[0-9a-f]{64}$/.test(asString(r[3]) ?? '') };
      }
      case 'reserve': {
        if (isExpired(r)) return { reply: [r[0].toString(), r[1]] };
        const got = reserveReply(r);
        if (!got) mismatch(where, `reserve reply ${show(r)}: want "<seq>:<existed>:<evicted>", then ":<continuation>"`);
        const p = calls[0].p;
        const items = itemsOf(inp.request);
        const out = { turn: turnOf(got.seq, this.P, p).toString(), continues: false, delta_count: items.length };
        const c = got.continuation ? decodeContinuation(got.continuation) : null;
        if (got.continuation && !c) mismatch(where, 'the continuation does not decode');
        if (got.existed === 0) return { ...out, reason: 'missing_state' };
        if (!c) return { ...out, reason: 'superseded_turn' };
        // Rows 5-8 of PROTOCOL.md 5.1 compare the request's fingerprints
        // (section 4) with the continuation's; this check does not compute
        // fingerprints, so it takes the reason from the vectors and checks
        // everything else the continuation decides.
        const want = step.result.reason;
        this.partial[want || 'continue'] = (this.partial[want || 'continue'] ?? 0) + 1;
        if (want === 'prompt_changed') return { ...out, reason: want };
        if (want === 'not_append_only') return { ...out, reason: want };
        if (want === 'empty_delta') {
          if (c.items !== items.length) mismatch(where, `empty_delta, but the continuation has ${c.items} items and the request ${items.length}`);
          return { ...out, reason: want };
        }
        if (want !== '') mismatch(where, `reason ${want} where the reply allows only prompt_changed, not_append_only, empty_delta or none`);
        if (c.items >= items.length) mismatch(where, `continues with ${c.items} items matched of ${items.length}`);
        const delta = items.slice(c.items);
        return {
          ...out, reason: '', continues: true, delta, delta_count: delta.length, previous_response_id: c.responseId,
          origin_replica: c.replica, origin_socket: c.socket.toString(),
        };
      }
      case 'record': {
        if (calls[0].script === 'abort') return { outcome: 'dropped' };
        if (isExpired(r)) return { outcome: 'expired' };
        const status = Buffer.isBuffer(r) ? /^(published|stale|gone):[0-9]+$/.exec(r.toString()) : null;
        if (!status) mismatch(where, `record reply ${show(r)}: want "<status>:<evicted>"`);
        // The continuation sent: its parts that follow from the input.
        const c = decodeContinuation(calls[0].args[3]);
        if (!c) mismatch(where, 'the continuation sent does not decode');
        if (inp.response_id !== undefined) {
          const replica = inp.socket_replica || this.o.replica;
          expectSame(where, 'continuation sent', {
            responseId: c.responseId, socket: c.socket.toString(), replica: c.replica,
            items: c.items,
          }, {
            responseId: inp.response_id, socket: inp.socket_id, replica: `#${hex16(xxhash64(utf8(replica)))}`,
            items: itemsOf(inp.request).length + inp.output.length,
          });
        }
        return { outcome: status[1] };
      }
      case 'abort':
        return { removed: r === 1 };
      case 'clear':
        if (typeof r !== 'number') mismatch(where, `clear reply ${show(r)}`);
        return null;
      case 'is_current': {
        if (!r.length) return { current: false };
        const t = BigInt(r[1].toString());
        return { current: turnOf(t < 0n ? -t : t, this.P, calls[0].p).toString() === inp.turn };
      }
      case 'inspect': {
        if (!r.length) return { exists: false };
        const t = BigInt(r[1].toString());
        const out = { exists: true, turn: turnOf(t < 0n ? -t : t, this.P, calls[0].p).toString(), has_continuation: t < 0n };
        if (r[0] !== null) out.updated_at = rfc3339(unpackScore(Number(r[0].toString())).touchedMs);
        if (t < 0n) {
          const c = decodeContinuation(r[2] ?? Buffer.alloc(0));
          if (!c) mismatch(where, 'the published continuation does not decode');
          Object.assign(out, { response_id: c.responseId, origin_replica: c.replica, origin_socket: c.socket.toString(), items: c.items, transcript_bytes: c.bytes });
        }
        return out;
      }
      case 'prune':
        if (!Array.isArray(r) || r.length !== 3) mismatch(where, `prune reply ${show(r)}`);
        return { ttl: r[0], owners: r[1], bytes: r[2] };
      default:
        return undefined;
    }
  }

  // dump reads every key of the run, in the vectors' terms. Its commands
  // go out together (RESP pipelining), to keep the replay quick.
  async dump(where) {
    const names = await this.keysOfRun();
    const meta = await Promise.all(names.map((k) => Promise.all([this.redis.ok('TYPE', k), this.redis.ok('PTTL', k)])));
    const content = await Promise.all(names.map((k, i) => {
      switch (String(meta[i][0])) {
        case 'hash': return this.redis.ok('HGETALL', k);
        case 'zset': return this.redis.ok('ZRANGE', k, '0', '-1', 'WITHSCORES');
        case 'list': return this.redis.ok('LRANGE', k, '0', '-1');
        case 'string': return this.redis.ok('GET', k);
        default: return null;
      }
    }));
    return { names, meta, content, at: await this.serverMs() };
  }

  // stateBack turns a dump into the vectors' terms.
  stateBack(where, { names, meta, content }) {
    const out = new Map();
    // Each state's touch, as its LRU entry holds it (ms since 2025-01-01):
    // its refresh tick in o follows it.
    const touched = new Map();
    for (const [i, key] of names.entries()) {
      if (String(meta[i][0]) !== 'zset') continue;
      const c = content[i];
      for (let k = 0; k < c.length; k += 2) {
        touched.set(stateOfEntry(key, c[k]), Math.floor(Number(c[k + 1].toString()) / 8192));
      }
    }
    for (const [i, key] of names.entries()) {
      const from = `${this.ns}:{${this.ns}`;
      let name = `${this.o.namespace}:{${this.o.namespace}${key.slice(from.length)}`;
      const p = Number(/^[^{]*\{[^}]*:(\d+)\}/.exec(key)?.[1]);
      const q = /:q:.*:([0-9a-f]{18})$/.exec(key);
      if (q) {
        const vec = this.opsBack.get(q[1]);
        if (!vec) mismatch(where, `answer key ${key} of an op this run never sent`);
        name = name.slice(0, -18) + vec;
      }
      const type = String(meta[i][0]);
      const st = { type, pttl: meta[i][1] };
      const opBack = (b) => {
        const vec = this.opsBack.get(b.toString('hex'));
        if (!vec) mismatch(where, `op ${b.toString('hex')} in ${key} was never sent`);
        return Buffer.from(vec, 'hex');
      };
      const c = content[i];
      if (type === 'hash') {
        st.hash = {};
        for (let k = 0; k < c.length; k += 2) {
          const f = c[k].toString();
          let v = c[k + 1];
          if (name.includes('}:o:')) {
            if (f === 't') {
              const t = v.toString(), neg = t.startsWith('-');
              v = utf8(`${neg ? '-' : ''}${this.seqBack(where, p, neg ? t.slice(1) : t)}`);
            } else if (f === 'o') {
              // o: an op, flags and tick, then maybe a record's op (Appendix B);
              // the tick is its entry's touch's.
              const touch = touched.get(key);
              if (touch === undefined || v[10] !== this.tick(touch)) mismatch(where, `${key}: refresh tick ${v[10]} is not its LRU entry's touch's`);
              const tick = Buffer.from([v[9], this.tick(this.touchBack(where, touch))]);
              v = Buffer.concat([opBack(v.subarray(0, 9)), tick, ...(v.length > 11 ? [opBack(v.subarray(11, 20))] : [])]);
            }
          }
          st.hash[f] = v;
        }
      } else if (type === 'zset') {
        st.zset = [];
        for (let k = 0; k < c.length; k += 2) {
          const score = Number(c[k + 1].toString());
          st.zset.push({ member: c[k], score: this.scoreBack(where, score) });
        }
      } else if (type === 'list') {
        st.list = c;
      } else if (type === 'string') {
        let v = c;
        if (name.endsWith('}:seq')) v = utf8(String(this.seqBack(where, p, v.toString())));
        const m = /^(\d+):[01][01]/.exec(v.toString('latin1'));
        if (q && m) v = Buffer.concat([utf8(String(this.seqBack(where, p, m[1]))), v.subarray(m[1].length)]);
        st.string = v;
      }
      out.set(name, st);
    }
    return out;
  }

  // compareState compares the keys after a step with the vectors'.
  compareState(where, got, want) {
    const names = [...got.keys()].sort();
    const wantNames = want.map((k) => k.key).sort();
    expectSame(where, 'keys', names, wantNames);
    for (const w of want) {
      const g = got.get(w.key);
      const at = `${where}: key ${w.key}`;
      expectSame(at, 'type', g.type, w.type);
      expectSame(at, 'TTL', g.pttl === -1 ? 'none' : g.pttl > 0 ? 'some' : g.pttl, w.pttl_ms === -1 ? 'none' : 'some');
      if (w.hash) {
        const wh = {};
        for (const [f, v] of Object.entries(w.hash)) wh[f] = vectorValue(v);
        expectSame(at, 'fields', g.hash, wh);
      }
      if (w.zset) expectSame(at, 'members', g.zset, w.zset.map((z) => ({ member: utf8(z.member), score: z.score })));
      if (w.list) expectSame(at, 'elements', g.list, w.list.map(vectorValue));
      if (w.string !== undefined) expectSame(at, 'value', g.string, vectorValue(w.string));
    }
  }

  async run() {
    const steps = this.v.store_scenario.steps;
    if ((await this.keysOfRun()).length) throw new Setup(`namespace ${this.ns} is in use`);
    for (const step of steps) {
      const where = `store_scenario: ${step.name}`;
      const T = Date.parse(step.server_time); // ms since the Unix epoch
      const stepMs = T - SCORE_EPOCH_MS;
      await this.keepTime(where, stepMs);
      if (this.last && stepMs - this.last.stepMs > JUMP_MS) {
        // Stand where the scenario's clock stands relative to the previous step.
        const ms = this.last.at + (stepMs - this.last.stepMs) - (await this.serverMs()) - this.shifted;
        if (ms > 0) await this.shift(where, ms);
        this.counts.jumps++;
      }

      let calls = this.compose(step);
      let real;
      if (calls === null) { // a call of an earlier step, sent again as it was
        const from = this.sent.get(step.input.sent_again);
        if (!from) mismatch(where, `sends again ${step.input.sent_again}, which was not replayed`);
        calls = from.composed;
        real = from.real;
        this.counts.resent++;
      } else if (calls === undefined) {
        mismatch(where, `operation ${step.op}: this check does not know it`);
      }
      expectSame(where, 'number of calls', calls.length, step.calls.length);
      for (const [i, c] of calls.entries()) {
        const w = step.calls[i];
        expectSame(where, `call ${i + 1}`, { command: 'EVALSHA', script: c.script, keys: c.keys, args: c.args.map((a) => (Buffer.isBuffer(a) ? a : utf8(a))) },
          { command: w.command, script: w.script, keys: w.keys, args: w.args.map(vectorValue) });
      }
      if (!real) {
        real = [];
        for (const c of calls) real.push(await this.toRun(where, c, stepMs));
      }
      this.sent.set(step.name, { composed: calls, real });

      const before = await this.serverMs();
      const got = [];
      for (const c of real) got.push({ reply: await this.send(where, c), at: await this.serverMs() });
      const after = got.length ? got[got.length - 1].at : before;
      this.touches.push({ lo: before + this.shifted, hi: after + this.shifted, vec: stepMs });
      this.last = { stepMs, at: before + this.shifted };
      const state = await this.dump(where);
      for (const [hex, m] of this.ops) {
        if (m.deadline > stepMs && state.at >= m.realDeadline) {
          throw new Timing(`${where}: the replay fell behind op ${hex}'s deadline (${state.at} >= ${m.realDeadline}; the machine may be loaded)`);
        }
      }
      const replies = got.map((g, i) => this.back(where, real[i], g.reply, vectorValue(step.calls[i].reply), before, g.at));
      for (const [i, r] of replies.entries()) expectSame(where, `reply ${i + 1}`, r, vectorValue(step.calls[i].reply));
      const result = step.input?.sent_again
        ? { reply: [asString(replies[0][0]), replies[0][1]] }
        : this.decide(step, calls, replies);
      expectSame(where, 'result', result, step.result ?? null);
      this.compareState(where, this.stateBack(where, state), step.state);
      if (process.env.VECTORS_DEBUG) console.log(`${state.at} ${step.server_time} ${step.name.slice(0, 50)}`);
      this.counts.steps++;
      this.counts.calls += calls.length;
    }
  }
}

// ---- main -----------------------------------------------------------------------

async function main() {
  const v = JSON.parse(readFileSync(path.join(ROOT, 'testdata/vectors.json'), 'utf8'));
  const fpv = JSON.parse(readFileSync(path.join(ROOT, 'testdata/fingerprint-vectors.json'), 'utf8'));
  const counts = { static: 0, steps: 0, calls: 0, resent: 0 };
  checkStatic(v, fpv, counts);

  const addr = (process.env.CONTSTORE_REDIS_ADDR ?? '').trim();
  if (!addr) {
    const msg = 'CONTSTORE_REDIS_ADDR is not set: the store scenario needs a Redis server (run scripts/redis-env.sh node scripts/vectors.mjs)';
    if (CI) throw new Setup(`${msg}; CI is set, so this is a failure`);
    console.log(`vectors.mjs: ${counts.static} static cases match; scenario skipped: ${msg}`);
    return;
  }
  const redis = await Redis.connect(addr);
  try {
    const shas = {};
    for (const s of v.scripts) {
      const sha = (await redis.ok('SCRIPT', 'LOAD', compose(s.file).source)).toString();
      expectSame(`scripts: ${s.name}`, 'SHA1 from SCRIPT LOAD', sha, s.sha1);
      shas[s.name] = sha;
    }
    const lib = composeLibrary(v.scripts);
    expectSame('function_library', 'name from FUNCTION LOAD', (await redis.ok('FUNCTION', 'LOAD', 'REPLACE', lib.source)).toString(), lib.name);
    let partial;
    counts.jumps = 0;
    for (let attempt = 1; ; attempt++) {
      const sc = new Scenario(redis, v, fpv, shas, { ...counts, steps: 0, calls: 0, resent: 0, jumps: 0 }, attempt === 1 ? 1 : 4);
      try {
        await sc.run();
        Object.assign(counts, sc.counts);
        partial = sc.partial;
        break;
      } catch (err) {
        if (!(err instanceof Timing) || attempt === 2) throw err;
        console.log(`vectors.mjs: ${err.message}; replaying once more`);
      } finally {
        await sc.cleanup().catch((err) => console.error(`vectors.mjs: could not delete namespace ${sc.ns}: ${err.message}`));
      }
    }
    const parts = Object.entries(partial).map(([k, n]) => `${n} ${k}`).join(', ');
    console.log(`vectors.mjs: ${counts.static} static cases and ${counts.steps} scenario steps (${counts.calls} calls, ${counts.resent} sent again verbatim) match on ${addr}; 0 skipped`);
    console.log(`vectors.mjs: gaps of the scenario not waited out, the stored times moved back instead (PROTOCOL.md 12.1): ${counts.jumps}`);
    console.log(`vectors.mjs: reserve decisions that need request fingerprints (PROTOCOL.md 5.1 rows 5-8), checked against the continuation but not re-derived: ${parts || 'none'}`);
  } finally {
    redis.close();
  }
}

const watchdog = setTimeout(() => {
  console.error(`vectors.mjs: FAIL: not done after ${WATCHDOG_MS / 1000} s`);
  process.exit(1);
}, WATCHDOG_MS);
watchdog.unref();

main().then(() => {
  clearTimeout(watchdog);
}, (err) => {
  // A mismatch, or a server that cannot be reached: the message says it
  // all. Anything else is a fault of this script: show where.
  if (err instanceof Mismatch || err instanceof Setup || err.code) console.error(`vectors.mjs: FAIL: ${err.message}`);
  else console.error(`vectors.mjs: FAIL: ${err.stack ?? err}`);
  process.exit(err instanceof Mismatch ? 1 : 2);
});
