package idempotency

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jmespath-community/go-jmespath/pkg/functions"
	"github.com/jmespath-community/go-jmespath/pkg/interpreter"
	"github.com/jmespath-community/go-jmespath/pkg/parsing"
)

// powertoolsJSON is Powertools' powertools_json(): a JSON string parsed
// (its integers exact, as decodeJSON), so that an expression can reach
// into an API Gateway or SQS body.
var powertoolsJSON = functions.FunctionEntry{
	Name:      "powertools_json",
	Arguments: []functions.ArgSpec{{Types: []functions.JpType{functions.JpString}}},
	Handler: func(args []any) (any, error) {
		v, err := decodeJSON([]byte(args[0].(string)))
		if err != nil {
			return nil, errors.New("powertools_json: the string is not JSON")
		}
		return v, nil
	},
}

// caller runs the expressions' functions: JMESPath Community Edition's
// and powertools_json. Safe for concurrent use.
var caller = interpreter.NewFunctionCaller(append(functions.GetDefaultFunctions(), powertoolsJSON)...)

// expr is a compiled KeyPath or PayloadPath.
type expr struct{ node parsing.ASTNode }

// compile parses src (JMESPath Community Edition). folded: src is over an
// HTTP event whose header names foldHeaders lowers, and the names src
// looks up in them are lowered too, so that a header is found whatever
// the case of its name in the event and in src.
func compile(src string, folded bool) (*expr, error) {
	node, err := parsing.NewParser().Parse(src)
	if err != nil {
		return nil, err
	}
	if folded {
		lowerHeaderNames(&node, atRoot)
	}
	return &expr{node: node}, nil
}

// search evaluates the expression on doc (decodeJSON's).
func (e *expr) search(doc any) (any, error) {
	return interpreter.NewInterpreter(doc, caller, nil).Execute(e.node, doc)
}

// httpEvents are the aws-lambda-go events whose headers and
// multiValueHeaders are HTTP headers, whose names are case-insensitive:
// API Gateway REST (v1) and WebSocket, HTTP APIs (v2), ALB target groups,
// function URLs, and the authorizers' requests.
var httpEvents = map[reflect.Type]bool{
	reflect.TypeFor[events.APIGatewayProxyRequest]():                       true,
	reflect.TypeFor[events.APIGatewayV2HTTPRequest]():                      true,
	reflect.TypeFor[events.APIGatewayWebsocketProxyRequest]():              true,
	reflect.TypeFor[events.ALBTargetGroupRequest]():                        true,
	reflect.TypeFor[events.LambdaFunctionURLRequest]():                     true,
	reflect.TypeFor[events.APIGatewayCustomAuthorizerRequestTypeRequest](): true,
	reflect.TypeFor[events.APIGatewayV2CustomAuthorizerV1Request]():        true,
	reflect.TypeFor[events.APIGatewayV2CustomAuthorizerV2Request]():        true,
}

// isHTTPEvent reports whether E (or what it points to) is one of
// httpEvents.
func isHTTPEvent[E any]() bool {
	t := reflect.TypeFor[E]()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return httpEvents[t]
}

// headerFields are an HTTP event's fields of headers, by their JSON names.
var headerFields = []string{"headers", "multiValueHeaders"}

// foldHeaders lowers the names in an HTTP event's headers (doc, as
// decoded), in place. Names that differ only in case become one: a
// multi-value header's values joined in the order of the names as sent
// (sorted), a single-value header the first of them.
func foldHeaders(doc any) {
	ev, ok := doc.(map[string]any)
	if !ok {
		return
	}
	for _, f := range headerFields {
		h, ok := ev[f].(map[string]any)
		if !ok {
			continue
		}
		names := make([]string, 0, len(h))
		for n := range h {
			names = append(names, n)
		}
		slices.Sort(names)
		low := make(map[string]any, len(h))
		for _, n := range names {
			l := strings.ToLower(n)
			prev, seen := low[l]
			switch {
			case !seen:
				low[l] = h[n]
			case isList(prev) && isList(h[n]):
				low[l] = append(slices.Clip(prev.([]any)), h[n].([]any)...)
			}
		}
		ev[f] = low
	}
}

func isList(v any) bool { _, ok := v.([]any); return ok }

// scope is what an expression node is evaluated on, as far as header
// folding cares: the event, its headers (or multiValueHeaders), or
// anything else.
type scope int

const (
	atOther scope = iota
	atRoot
	atHeaders
)

// lowerHeaderNames lowers, in place, each field name n looks up in the
// event's headers (headers."Idempotency-Key",
// multiValueHeaders."Idempotency-Key"[0], headers | "X-Key", a
// multi-select under headers), given that n is evaluated on at; it
// returns what n's result is.
func lowerHeaderNames(n *parsing.ASTNode, at scope) scope {
	switch n.NodeType {
	case parsing.ASTField:
		name, _ := n.Value.(string)
		switch {
		case at == atRoot && slices.Contains(headerFields, name):
			return atHeaders
		case at == atHeaders:
			n.Value = strings.ToLower(name)
		}
		return atOther
	case parsing.ASTIdentity, parsing.ASTCurrentNode:
		return at
	case parsing.ASTRootNode:
		return atRoot
	case parsing.ASTSubexpression, parsing.ASTPipe, parsing.ASTIndexExpression:
		// Each child is evaluated on the one before's result.
		s := at
		for i := range n.Children {
			s = lowerHeaderNames(&n.Children[i], s)
		}
		return s
	case parsing.ASTProjection, parsing.ASTValueProjection, parsing.ASTFilterProjection, parsing.ASTFlatten:
		// The left side on this node's value, the rest on its elements.
		for i := range n.Children {
			if i == 0 {
				lowerHeaderNames(&n.Children[i], at)
			} else {
				lowerHeaderNames(&n.Children[i], atOther)
			}
		}
		return atOther
	case parsing.ASTExpRef:
		for i := range n.Children {
			lowerHeaderNames(&n.Children[i], atOther)
		}
		return atOther
	}
	// Multi-selects, their key-value pairs, function arguments,
	// comparisons, and, or, not, arithmetic: each on this node's value.
	for i := range n.Children {
		lowerHeaderNames(&n.Children[i], at)
	}
	return atOther
}

// unquotedDash refuses an expression with a '-' between two letters or
// digits outside quotes: JMESPath reads headers.Idempotency-Key as a
// subtraction (headers.Idempotency minus Key), which finds nothing in
// every event; the name wants its quotes: headers."Idempotency-Key".
func unquotedDash(src string) error {
	var quote rune
	prev := ' '
	for i, r := range src {
		switch {
		case quote != 0:
			if r == quote && (i == 0 || src[i-1] != '\\') {
				quote = 0
			}
		case r == '"' || r == '\'' || r == '`':
			quote = r
		case r == '-' && isNameChar(prev) && i+1 < len(src) && isNameChar(rune(src[i+1])):
			return fmt.Errorf("%q reads a '-' as a subtraction (%s - %s): quote a name holding one, as headers.\"Idempotency-Key\"", src, strings.TrimSpace(src[:i]), strings.TrimSpace(src[i+1:]))
		}
		prev = r
	}
	return nil
}

func isNameChar(r rune) bool {
	return r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
