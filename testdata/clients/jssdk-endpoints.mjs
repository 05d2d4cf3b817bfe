// Drives the OpenAI JS SDK's calls to the API's other endpoints, and one
// create-response call to have a response to retrieve. Each step prints one
// JSON line: {"step":…, "sent":[…], "result":…}, sent being every request
// the SDK handed to fetch (method, URL, headers, body), result what the
// SDK returned. See fake.mjs for the environment (FAKE_STORE is the store
// of the create step).
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node jssdk-endpoints.mjs STEP...
//
// models       client.models.list(): result is the page's data
// count        client.responses.inputTokens.count({model, input})
// create       client.responses.create({model, input, store})
// retrieve ID  client.responses.retrieve(ID)
import OpenAI from 'openai';
import { settings } from './fake.mjs';

const usage = 'usage: node jssdk-endpoints.mjs (models|count|create|retrieve ID)...';
const { baseURL, apiKey, store } = settings();

// sent collects the requests of the current step.
let sent = [];

const client = new OpenAI({
  baseURL,
  apiKey,
  maxRetries: 0,
  timeout: 30_000,
  defaultHeaders: { 'x-session-id': 'jssdk-endpoints' },
  // The network is node's own fetch, as by default; this only notes what
  // the SDK asks it to send.
  fetch: (url, init = {}) => {
    const headers = {};
    new Headers(init.headers).forEach((value, name) => {
      headers[name] = value;
    });
    const body = init.body == null ? null : typeof init.body === 'string' ? init.body : '<not a string>';
    sent.push({ method: (init.method ?? 'GET').toUpperCase(), url: String(url), headers, body });
    return globalThis.fetch(url, init);
  },
});

const countParams = { model: 'gpt-5.1', input: 'How many tokens does this take?' };

const args = process.argv.slice(2);
if (args.length === 0) {
  console.error(usage);
  process.exit(2);
}
while (args.length > 0) {
  const step = args.shift();
  let result;
  switch (step) {
    case 'models': {
      const page = await client.models.list();
      if (page.hasNextPage()) throw new Error('models.list() has more than one page');
      result = page.data;
      break;
    }
    case 'count':
      result = await client.responses.inputTokens.count(countParams);
      break;
    case 'create':
      result = await client.responses.create({ model: 'gpt-5.1', input: 'Say something to retrieve later.', store });
      break;
    case 'retrieve': {
      const id = args.shift();
      if (!id) {
        console.error(usage);
        process.exit(2);
      }
      result = await client.responses.retrieve(id);
      break;
    }
    default:
      console.error(usage);
      process.exit(2);
  }
  console.log(JSON.stringify({ step, sent, result }));
  sent = [];
}
