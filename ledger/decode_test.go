package ledger

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TestDecodeRecordAgrees (and encodeRecord, both ways) holds the hand-written decoder to the reflective
// one: for records with every field drawn at random (each left at its zero
// value half the time, so omitempty drops it), the item MarshalMap makes
// decodes to the same Record both ways, and to the record marshalled.
// Every Record field must be set here: a field the decoder forgot shows up
// as a difference.
func TestDecodeRecordAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := func() string {
		if rng.IntN(2) == 0 {
			return ""
		}
		return "v" + strconv.Itoa(rng.IntN(1e6))
	}
	n := func() int64 {
		if rng.IntN(2) == 0 {
			return 0
		}
		return rng.Int64N(1 << 50)
	}
	b := func() bool { return rng.IntN(2) == 0 }
	hist := func() *Attempt {
		if rng.IntN(2) == 0 {
			return nil
		}
		return &Attempt{N: int(n()), At: n(), State: State(s()), Error: s()}
	}
	steps := func() map[string]string {
		if rng.IntN(2) == 0 {
			return nil
		}
		return map[string]string{"charge.v2[0]": s() + "x", "mark%": "true"}
	}
	for i := range 500 {
		want := Record{
			PK: "j#" + s(), ID: s(), Kind: s(), Args: s(), State: State(s()), Attempt: int(n()), MaxAttempts: int(n()),
			KeyHash: s(), Policy: s(), CreatedAt: n(), UpdatedAt: n(), RunAt: n(), Deadline: n(), LeaseUntil: n(),
			Token: n(), LastError: s(), Result: s(), ExpiresAt: n(), ParentID: s(), ListState: s(), ListErr: s(), ListAt: n(),
			Undispatched: b(), Nonce: s(), Nonce1: s(), Nonce2: s(), Hist0: hist(), Hist1: hist(), Hist2: hist(),
			Request: s(), RequestAt: n(), CutOffs: int(n()), Returns: int(n()), ArgsHash: s(), Cancelled: b(), HookPending: b(),
			HookUntil: n(), Defers: int(n()), Slot: n(), Ticket: n(), Steps: steps(), CancelReq: s(), ReopenWaits: b(), StepsGen: int(n() % 1000), RanMark: b(), ByCheck: b(), NonJob: b(), Queue: s(),
		}
		if b() {
			want.Children = []string{"c" + strconv.Itoa(i), "d" + strconv.Itoa(i)}
		}
		if b() {
			want.Parents = []string{"p" + strconv.Itoa(i), "q" + strconv.Itoa(i)}
			want.Released = []string{"p" + strconv.Itoa(i)}
		}
		item, err := attributevalue.MarshalMap(want)
		if err != nil {
			t.Fatal(err)
		}
		// The hand encoder writes the reflective encoder's item.
		if mine := encodeRecord(&want); !reflect.DeepEqual(mine, item) {
			t.Fatalf("record %d: encodeRecord gave\n%#v\nMarshalMap gave\n%#v", i, mine, item)
		}
		item["somethingNewer"] = &types.AttributeValueMemberS{Value: "ignored"}
		var slow Record
		if err := attributevalue.UnmarshalMap(item, &slow); err != nil {
			t.Fatal(err)
		}
		fast, err := decodeRecord(item)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("record %d: decodeRecord gave\n%+v\nUnmarshalMap gave\n%+v", i, fast, slow)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("record %d: decoded\n%+v\nfrom\n%+v", i, fast, want)
		}
	}
	// Every field was exercised: a Record field added later and not drawn
	// above would stay zero in every record and pass unnoticed.
	if got, want := reflect.TypeFor[Record]().NumField(), 59; got != want {
		t.Fatalf("Record has %d fields, this test draws %d: draw the new ones and teach decodeRecord them", got, want)
	}
}

// TestDecodeRecordRefusesWrongTypes: an attribute of the wrong type is an
// error naming the attribute, never a silent zero (stricter than the
// reflective decoder, which reads a number into a string field).
func TestDecodeRecordRefusesWrongTypes(t *testing.T) {
	for name, av := range map[string]types.AttributeValue{
		AttrToken:       &types.AttributeValueMemberS{Value: "1"},
		AttrState:       &types.AttributeValueMemberN{Value: "1"},
		AttrHookPending: &types.AttributeValueMemberS{Value: "true"},
		AttrAttempt:     &types.AttributeValueMemberN{Value: "x"},
		AttrHist0:       &types.AttributeValueMemberS{Value: "x"},
	} {
		_, err := decodeRecord(map[string]types.AttributeValue{AttrID: &types.AttributeValueMemberS{Value: "a"}, name: av})
		if err == nil || !strings.Contains(err.Error(), strconv.Quote(name)) {
			t.Errorf("%s as %T: %v, want an error naming the attribute", name, av, err)
		}
	}
}

func BenchmarkDecodeRecord(b *testing.B) {
	item, err := attributevalue.MarshalMap(Record{PK: "j#a", ID: "a", Kind: "email", Args: `{"to":"x"}`, State: Processing,
		Attempt: 1, MaxAttempts: 25, Token: 1, CreatedAt: 1, UpdatedAt: 2, LeaseUntil: 3, Nonce: "n"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("reflective", func(b *testing.B) {
		for b.Loop() {
			var r Record
			if err := attributevalue.UnmarshalMap(item, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decodeRecord", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeRecord(item); err != nil {
				b.Fatal(err)
			}
		}
	})
}
