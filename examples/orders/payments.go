package orders

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/idempotency"
)

// PaymentRequest is the body of a POST to the payments API.
type PaymentRequest struct {
	Cents    int    `json:"cents"`
	Currency string `json:"currency"`
	Card     string `json:"card"`
}

// Payment is the API's answer to a charge.
type Payment struct {
	ChargeID string `json:"chargeId,omitempty"`
	Error    string `json:"error,omitempty"`
}

type (
	urlRequest  = events.LambdaFunctionURLRequest
	urlResponse = events.LambdaFunctionURLResponse
)

// PaymentsAPI is a function URL handler that charges a card once per
// Idempotency-Key header: the first request charges and its response is
// recorded; a repeat of the key (a client's retry after a timeout) gets
// that response again, marked Idempotent-Replayed: true, and the card is
// not charged again. A repeat whose amount, currency or card differs gets
// 422; one sent while the first is still charging, 409 with Retry-After;
// a request with no key, 400. A provider error (5xx from the provider,
// a timeout) releases the key, so the client's retry charges; a declined
// card is an answer (402), recorded like a charge.
func PaymentsAPI(store *idempotency.Store, p Provider, log *slog.Logger) (func(context.Context, urlRequest) (urlResponse, error), error) {
	charge := func(ctx context.Context, req urlRequest) (urlResponse, error) {
		var body PaymentRequest
		if err := json.Unmarshal([]byte(req.Body), &body); err != nil || body.Cents <= 0 || body.Card == "" || len(body.Currency) != 3 {
			return reply(http.StatusBadRequest, Payment{Error: "want a JSON body with cents > 0, a 3-letter currency and a card"}), nil
		}
		if strings.HasPrefix(body.Card, "declined") {
			return reply(http.StatusPaymentRequired, Payment{Error: ErrDeclined.Error()}), nil
		}
		// The provider's own key: the call's, so that a charge whose
		// response was lost and is retried under the same key is the
		// provider's repeat too.
		id, err := p.Charge(ctx, body.Card, body.Cents, req.Headers["idempotency-key"])
		if err != nil {
			return urlResponse{}, err // released: the client's retry charges
		}
		return reply(http.StatusCreated, Payment{ChargeID: id}), nil
	}
	h, err := idempotency.Handler(store, charge, &idempotency.HandlerOptions[urlRequest, urlResponse]{
		KeyPath:     `headers."idempotency-key"`, // function URLs lower-case header names
		PayloadPath: `powertools_json(body).[cents, currency, card]`,
		Replayed: func(r urlResponse) urlResponse {
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers["Idempotent-Replayed"] = "true"
			return r
		},
	})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req urlRequest) (urlResponse, error) {
		resp, err := h(ctx, req)
		var inProgress *idempotency.InProgressError
		switch {
		case err == nil:
			return resp, nil
		case errors.Is(err, idempotency.ErrNoKey):
			return reply(http.StatusBadRequest, Payment{Error: "an Idempotency-Key header is required"}), nil
		case errors.As(err, &inProgress):
			r := reply(http.StatusConflict, Payment{Error: "a request with this Idempotency-Key is in progress"})
			r.Headers["Retry-After"] = "1"
			return r, nil
		case errors.Is(err, idempotency.ErrPayloadMismatch):
			return reply(http.StatusUnprocessableEntity, Payment{Error: "this Idempotency-Key was used with another request"}), nil
		}
		// The error may quote the provider; the client gets no detail.
		log.ErrorContext(ctx, "payments: charge failed", "err", err)
		return reply(http.StatusBadGateway, Payment{Error: "the charge failed; retry with the same Idempotency-Key"}), nil
	}, nil
}

func reply(status int, p Payment) urlResponse {
	b, _ := json.Marshal(p) // two strings always marshal
	return urlResponse{StatusCode: status, Headers: map[string]string{"Content-Type": "application/json"}, Body: string(b)}
}
