package enqueue

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Message is the SQS body of a job. It names the job, not its args: the
// args live in the ledger, so a message stays small whatever the payload.
type Message struct {
	V     int    `json:"v"`               // format version, 1
	ID    string `json:"id"`              // job id
	Kind  string `json:"kind"`            // job kind, for people reading a DLQ
	RunAt int64  `json:"runAt,omitempty"` // Unix ms; before it the message is carried forward without touching DynamoDB
	// Check marks the dispatch guard's message: at RunAt the worker looks
	// whether the job was ever started and runs it if not.
	Check bool `json:"check,omitempty"`
}

// MaxBodyBytes bounds what DecodeMessage accepts; a job message is < 200 bytes.
const MaxBodyBytes = 4096

// ErrMalformedMessage matches every body DecodeMessage refuses.
var ErrMalformedMessage = errors.New("nexjob: malformed job message")

// DecodeMessage parses an SQS body. It refuses anything that is not a
// version-1 job message with an id and a kind.
func DecodeMessage(body string) (Message, error) {
	if len(body) > MaxBodyBytes {
		return Message{}, fmt.Errorf("%w: %d bytes", ErrMalformedMessage, len(body))
	}
	var m Message
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrMalformedMessage, err)
	}
	if m.V != 1 || m.ID == "" || m.Kind == "" || m.RunAt < 0 {
		return Message{}, fmt.Errorf("%w: missing or bad fields", ErrMalformedMessage)
	}
	return m, nil
}

// Encode returns the SQS body.
func (m Message) Encode() string {
	b, _ := json.Marshal(m) // cannot fail: strings and ints
	return string(b)
}
