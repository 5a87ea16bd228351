package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

type total struct{ Customer string }

func (total) Kind() string { return "total" }

type amount struct {
	Cents int    `json:"cents"`
	Memo  string `json:"memo"`
}

// TestJobPageShowsTheResult: a Succeeded job's page gives its result's
// size and a link; the result itself only on request, escaped (a result
// written by anyone with the table's UpdateItem is markup-free on the
// page). A job with no result shows no result row.
func TestJobPageShowsTheResult(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorkerResult(reg, handler.ResultFunc[total, amount](func(context.Context, *handler.Job[total]) (amount, error) {
		return amount{Cents: 1250, Memo: "paid-in-full"}, nil
	}), nil)
	res, err := e.Client.Enqueue(context.Background(), total{Customer: "ada"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hostile, err := e.Client.Enqueue(context.Background(), total{Customer: "mallory"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, e.Handler(t, reg, &handler.Options{Logger: quiet}))
	e.RequireState(t, res.ID, ledger.Succeeded)
	if _, err := e.DB.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: aws.String(e.Table), Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: "j#" + hostile.ID}},
		UpdateExpression:          aws.String("SET #r = :r"),
		ExpressionAttributeNames:  map[string]string{"#r": ledger.AttrResult},
		ExpressionAttributeValues: map[string]types.AttributeValue{":r": &types.AttributeValueMemberS{Value: `"</pre><script>alert(1)</script>"`}},
	}); err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(settings.Settings{AWS: e.Cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	c := client(t)

	code, page := get(t, c, srv.URL+"/jobs/"+res.ID)
	if code != http.StatusOK || !strings.Contains(page, `36 bytes, <a id="showResult" href="/jobs/`+res.ID+`?result=1">show</a>`) || strings.Contains(page, "paid-in-full") {
		t.Fatalf("job page without ?result=1: %d, want the size and a link, not the result\n%s", code, page)
	}
	code, page = get(t, c, srv.URL+"/jobs/"+res.ID+"?result=1")
	if want := `<pre id="result">{&#34;cents&#34;:1250,&#34;memo&#34;:&#34;paid-in-full&#34;}</pre>`; code != http.StatusOK || !strings.Contains(page, want) {
		t.Fatalf("job page with ?result=1: %d, want %s\n%s", code, want, page)
	}
	_, page = get(t, c, srv.URL+"/jobs/"+hostile.ID+"?result=1")
	if strings.Contains(page, "<script>") || !strings.Contains(page, "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("a result with markup is not escaped:\n%s", page)
	}
	plain := newRig(t, false)
	if _, page := get(t, c, plain.srv.URL+"/jobs/"+plain.failed+"?result=1"); strings.Contains(page, "result") {
		t.Fatalf("a job with no result shows a result row:\n%s", page)
	}
}
