// Drives the OpenAI JS SDK against the fake upstream: one conversation of
// three user turns, each a tool loop, every request carrying the full
// history with store: false (no previous_response_id).
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node jssdk.mjs create-stream|create|stream-helper
//
// create-stream  responses.create({stream: true}), history gets the items of
//                the response.output_item.done events
// create         responses.create(), history gets response.output
// stream-helper  responses.stream() then finalResponse(), history gets its
//                output as the helper returns it
import OpenAI from 'openai';

const patterns = ['create-stream', 'create', 'stream-helper'];
const pattern = process.argv[2];
if (!patterns.includes(pattern)) {
  console.error(`usage: node jssdk.mjs ${patterns.join('|')}`);
  process.exit(2);
}
const baseURL = process.env.FAKE_BASE_URL;
if (!baseURL) {
  console.error('FAKE_BASE_URL is not set');
  process.exit(2);
}

const client = new OpenAI({
  baseURL,
  apiKey: process.env.FAKE_API_KEY || 'fake-key',
  maxRetries: 0,
  timeout: 30_000,
  defaultHeaders: { 'x-session-id': `jssdk-${pattern}` },
});

const params = {
  model: 'gpt-5.1',
  instructions: 'You are a terse assistant. Use run_command to inspect the machine before answering.',
  tools: [
    {
      type: 'function',
      name: 'run_command',
      description: 'Run a shell command and return its output.',
      parameters: {
        type: 'object',
        properties: { command: { type: 'string', description: 'The command line to run.' } },
        required: ['command'],
        additionalProperties: false,
      },
      strict: true,
    },
  ],
  store: false,
  include: ['reasoning.encrypted_content'],
  reasoning: { effort: 'low', summary: 'auto' },
};

const userTurns = [
  'What directory am I in?',
  'Now list the files there.',
  'Thanks. Summarise what you found in one line.',
];

// runCommand pretends to run the command the model asked for.
function runCommand(call) {
  const { command } = JSON.parse(call.arguments);
  const outputs = { 'echo hello': 'hello', ls: 'README.md\npackage.json', pwd: '/work' };
  return `$ ${command}\n${outputs[command] ?? ''}`;
}

// respond sends the whole history and returns the output items to append.
async function respond(input) {
  switch (pattern) {
    case 'create-stream': {
      const stream = await client.responses.create({ ...params, input, stream: true });
      const items = [];
      for await (const event of stream) {
        if (event.type === 'response.output_item.done') items.push(event.item);
        if (event.type === 'response.failed' || event.type === 'error') {
          throw new Error(`stream failed: ${JSON.stringify(event)}`);
        }
      }
      return items;
    }
    case 'create': {
      const response = await client.responses.create({ ...params, input });
      return response.output;
    }
    case 'stream-helper': {
      const stream = client.responses.stream({ ...params, input });
      for await (const _event of stream) {
        // events are only drained; the final response is what is kept
      }
      const response = await stream.finalResponse();
      return response.output;
    }
  }
}

const history = [];
let requests = 0;
for (const text of userTurns) {
  history.push({ role: 'user', content: text });
  for (let step = 0; ; step++) {
    if (step === 10) throw new Error('the tool loop did not end');
    const items = await respond(history);
    requests++;
    history.push(...items);
    const calls = items.filter((item) => item.type === 'function_call');
    if (calls.length === 0) {
      const message = items.find((item) => item.type === 'message');
      if (!message) throw new Error(`no message in ${JSON.stringify(items)}`);
      console.log(`[${pattern}] ${message.content.map((part) => part.text).join('')}`);
      break;
    }
    for (const call of calls) {
      history.push({ type: 'function_call_output', call_id: call.call_id, output: runCommand(call) });
    }
  }
}
console.log(`[${pattern}] ${requests} requests, ${history.length} history items`);
