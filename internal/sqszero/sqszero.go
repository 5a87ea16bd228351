// Package sqszero sends a ReceiveMessage with VisibilityTimeout 0.
//
// The SDK leaves an int32 field out of the request when it is zero, so
// ReceiveMessageInput{VisibilityTimeout: 0} receives with the queue's own
// timeout (360 s on the construct's DLQ): a peek hides what it looked at
// from every consumer for that long. Peek is an API option that writes the
// 0 into the serialised request (SQS's JSON protocol), so the messages
// stay visible to everyone else.
//
// # How it fails
//
// A body that is not a JSON object (an SQS protocol the option does not
// know) fails the call with an error saying so, before it is sent: the
// peek never falls back to hiding messages.
package sqszero

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Peek is the option: pass it to one ReceiveMessage call.
func Peek(o *sqs.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Build.Add(middleware.BuildMiddlewareFunc("nexjobVisibilityZero", zero), middleware.Before)
	})
}

func zero(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
	req, ok := in.Request.(*smithyhttp.Request)
	if !ok {
		return middleware.BuildOutput{}, middleware.Metadata{}, fmt.Errorf("nexjob: peek: unexpected request type %T", in.Request)
	}
	var body []byte
	if s := req.GetStream(); s != nil {
		b, err := io.ReadAll(s)
		if err != nil {
			return middleware.BuildOutput{}, middleware.Metadata{}, fmt.Errorf("nexjob: peek: read the request: %w", err)
		}
		body = b
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return middleware.BuildOutput{}, middleware.Metadata{}, fmt.Errorf("nexjob: peek: the ReceiveMessage request is not JSON, cannot ask for visibility 0")
	}
	fields["VisibilityTimeout"] = json.RawMessage("0")
	b, err := json.Marshal(fields)
	if err != nil {
		return middleware.BuildOutput{}, middleware.Metadata{}, fmt.Errorf("nexjob: peek: %w", err)
	}
	r, err := req.SetStream(bytes.NewReader(b))
	if err != nil {
		return middleware.BuildOutput{}, middleware.Metadata{}, fmt.Errorf("nexjob: peek: %w", err)
	}
	in.Request = r
	return next.HandleBuild(ctx, in)
}
